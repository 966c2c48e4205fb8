"""The findings, readable at every size: a list with one line per finding (most costly
first), and under it the selected finding in full: title, where in the code (once the
process's Python stacks named it), the result of a capture made for it, the evidence, the fix
and the next command. Text wraps at word boundaries to the width it is given.

The same view is the panel beside or below the process table (120 columns and wider), and
the findings screen that `f` opens at any size; under 120 columns a one-line banner above the
table says what is active and that `f` shows it.

Renders any objects with the attributes of ``diagnostics.findings.Finding`` (.id .severity
.title .evidence .fix .next_step .gpu .pid, and .where when set).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Size
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputop.core.format import safe_text
from gputop.diagnostics.findings import finding_key
from gputop.tui.view.severity import SEVERITY_MARK
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.scroll_range import set_virtual_size
from gputop.tui.widgets.text_line import TextLine

Piece = tuple[str, str | None]
Line = tuple[Piece, ...]
_ROLE_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "bold cyan",
               "bold": "bold", "dim": "dim", "label": "bold", "title": "bold"}
# The list's columns: glyph + severity, id, what it is about.
_ID_WIDTH = 16


def about(f) -> str:
    parts = []
    if getattr(f, "gpu", None) is not None:
        parts.append(f"GPU {f.gpu}")
    if getattr(f, "pid", None) is not None:
        parts.append(f"pid {f.pid}")
    return " ".join(parts)


def list_line(f, id_width: int = _ID_WIDTH, about_width: int = 16,
              note: str | None = None) -> list[Piece]:
    """One finding on one line: its severity's glyph, id, GPU and pid, title, and the short
    form of a capture's note."""
    pieces = [(f"{SEVERITY_MARK.get(f.severity, '•')} ", f.severity),
              (f"{f.id:<{id_width}}  ", "bold"), (f"{about(f):<{about_width}}  ", "dim"),
              (safe_text(f.title), None)]
    if note:
        pieces.append((" · " + safe_text(note.split(",")[0]), "dim"))
    return pieces


def _columns(findings: Sequence) -> tuple[int, int]:
    return (max((len(f.id) for f in findings), default=0),
            max((len(about(f)) for f in findings), default=0))


def needed_width(findings: Sequence) -> int:
    """The cells the list needs so that no title wraps (the panel's border not included)."""
    id_width, about_width = _columns(findings)
    return max((sum(cell_len(t) for t, _ in list_line(f, id_width, about_width))
                for f in findings), default=20)


def wrap(label: str, body: str, role: str | None, width: int) -> list[Line]:
    """``label body`` wrapped at word boundaries to ``width``, continuation lines indented."""
    text = Text(label + body)
    lines = text.wrap(_console(), max(10, width - 2), overflow="fold")
    out: list[Line] = []
    for n, line in enumerate(lines):
        plain = line.plain.rstrip()
        if n == 0 and label:
            out.append(((label, "label"), (plain[len(label):], role)))
        else:
            out.append((("  " if n else "", None), (plain, role)))
    return out


_CONSOLE = None


def _console():
    global _CONSOLE
    if _CONSOLE is None:
        from rich.console import Console

        _CONSOLE = Console(width=200, color_system=None, force_terminal=False)
    return _CONSOLE


def detail_lines(f, note: str | None, width: int) -> list[Line]:
    """The selected finding in full."""
    out: list[Line] = [((f"{SEVERITY_MARK.get(f.severity, '•')} {f.severity} ", f.severity),
                        (f.id, "bold"), (f"  {about(f)}", "dim"))]
    # The list's glyph says the severity without colour; here the word says it too.
    out += wrap("", safe_text(f.title), "title", width)
    where = getattr(f, "where", None)
    if where:
        out += wrap("where: ", safe_text(where), None, width)
    if note:
        out += wrap("", safe_text(note), "bold", width)
    if f.evidence:
        out += wrap("evidence: ", safe_text(f.evidence), None, width)
    if f.fix:
        out += wrap("fix: ", safe_text(f.fix), None, width)
    if getattr(f, "next_step", None):
        out += wrap("next: ", safe_text(f.next_step), "dim", width)
    return out


def _cut(pieces: list[Piece], width: int) -> list[Piece]:
    """A list line that does not fit ends in an ellipsis (the detail has it in full)."""
    out: list[Piece] = []
    used = 0
    for text, role in pieces:
        size = cell_len(text)
        if used + size > width:
            out.append((set_cell_size(text, max(0, width - used - 1)) + "…", role))
            return out
        out.append((text, role))
        used += size
    return out


def findings_lines(findings: Sequence, notes: Mapping[tuple, str] | None, selected: int,
                   width: int) -> tuple[list[Line], int]:
    """(lines, the list line of the selected finding): the list, then the selected finding
    in full. ``notes`` maps a finding's (id, gpu, pid) to a line shown with it."""
    if not findings:
        return [(("no findings", "dim"),)], -1
    notes = notes or {}
    out: list[Line] = []
    id_width, about_width = _columns(findings)
    for i, f in enumerate(findings):
        pieces = _cut(list_line(f, id_width, about_width, notes.get(finding_key(f))), width)
        if i == selected:
            pieces = [(t, "selected") for t, _ in pieces]
        out.append(tuple(pieces))
    out.append((("─" * max(0, width - 2), "dim"),))
    f = findings[max(0, min(selected, len(findings) - 1))]
    out += detail_lines(f, notes.get(finding_key(f)), width)
    return out, selected


def findings_text(findings: Sequence, notes: Mapping[tuple, str] | None = None,
                  selected: int = 0, width: int = 100) -> Text:
    """The view as plain text (tests, `gputop watch` look-alikes)."""
    lines, _ = findings_lines(findings, notes, selected, width)
    return Text("\n".join("".join(t for t, _ in line) for line in lines))


def banner_text(findings: Sequence, width: int) -> Text:
    """One line for narrow terminals: the worst finding and how to read them all."""
    if not findings:
        return Text("no findings", style="dim")
    f = findings[0]
    text = Text()
    text.append(f"{SEVERITY_MARK.get(f.severity, '•')} ", style=_ROLE_STYLE.get(f.severity))
    text.append(f"{len(findings)} finding{'s' if len(findings) > 1 else ''}: ", style="bold")
    text.append(f"{f.id} ", style=_ROLE_STYLE.get(f.severity))
    key = " · f: read them"
    body = safe_text(f.title)
    room = width - text.cell_len - len(key)
    if room < cell_len(body):
        body = set_cell_size(body, max(0, room - 1)) + "…"
    text.append(body)
    text.append(key, style="bold")
    return text


def _keep_places(ranked: list, shown: Mapping[tuple, int]) -> list:
    """While the reader walks the list: the findings still active keep the order they are
    shown in, and each new one goes in after the last that ranks before it (first, when it
    ranks first): a list that reshuffles under the cursor sends ↓ back to a finding already
    read."""
    rank = {finding_key(f): n for n, f in enumerate(ranked)}
    out = sorted((f for f in ranked if finding_key(f) in shown),
                 key=lambda f: shown[finding_key(f)])
    for f in ranked:
        if finding_key(f) in shown:
            continue
        mine = rank[finding_key(f)]
        before = [i for i, g in enumerate(out) if rank[finding_key(g)] < mine]
        out.insert(before[-1] + 1 if before else 0, f)
    return out


class FindingsView(ScrollView, can_focus=True):
    """The list and the selected finding, through the line API: a tick whose findings did
    not change costs nothing, and a change repaints only this view."""

    DEFAULT_CSS = """
    FindingsView { height: 1fr; scrollbar-size-vertical: 1; overflow-x: hidden; }
    FindingsView > .findings--selected { background: $block-cursor-blurred-background; }
    FindingsView:focus > .findings--selected { background: $block-cursor-background;
                                               color: $block-cursor-foreground; }
    """
    COMPONENT_CLASSES = {"findings--selected"}
    BINDINGS = [
        Binding("up", "select(-1)", "previous", show=False),
        Binding("down", "select(1)", "next", show=False),
    ]

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.findings: list = []
        self.notes: dict[tuple, str] = {}
        self.selected = 0
        # True once the reader picked a finding (keys, a click): it then stays selected while
        # it is active. Until then the top finding is the selected one, whatever raises.
        self.picked = False
        self._selected_key: tuple | None = None
        self.lines: list[Line] = []
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str | None, Style] | None = None
        self._key: tuple | None = None
        self._same: tuple | None = None  # the findings, selection and width last laid out

    def update_findings(self, findings: Sequence, notes: Mapping[tuple, str] | None = None
                        ) -> None:
        """Show ``findings`` (most important first), each with its note if it has one; the
        selection follows its finding when the order changes. While the same findings stay
        active their order stays too: costs move every tick, and a list whose lines swap
        places under the cursor cannot be read; it is sorted again when one raises or clears."""
        findings = list(findings)
        shown = {finding_key(f): n for n, f in enumerate(self.findings)}
        if len(shown) == len(findings) and all(finding_key(f) in shown for f in findings):
            findings.sort(key=lambda f: shown[finding_key(f)])
        elif self.picked and shown:
            findings = _keep_places(findings, shown)
        self.findings = findings
        if notes is not None:
            self.notes = dict(notes)
        keys = [finding_key(f) for f in self.findings]
        if not self.picked:
            self.selected = 0
        elif self._selected_key in keys:
            self.selected = keys.index(self._selected_key)
        self.selected = max(0, min(self.selected, len(self.findings) - 1))
        self._selected_key = keys[self.selected] if keys else None
        self._rebuild()

    @property
    def text(self) -> Text:
        return Text("\n".join("".join(t for t, _ in line) for line in self.lines))

    def action_select(self, step: int) -> None:
        if self.findings:
            self.picked = True
            self.select(self.selected + step)

    def select(self, index: int) -> None:
        """The reader picks finding ``index``: it stays selected while it is active."""
        self.picked = True
        index = max(0, min(index, len(self.findings) - 1))
        if index != self.selected:
            self.selected = index
            self._selected_key = finding_key(self.findings[index])
            self._rebuild()
        self.show_selected()
        # Again once Textual has laid out what the new detail changed (a scrollbar that
        # appears, a new scroll range): scrolled before that, the end of a tall detail was
        # clamped away and stayed below the view.
        self.call_after_refresh(self.show_selected)

    def show_selected(self) -> None:
        """Scroll so the selected finding's detail is in view, with as much of the list
        above it as fits (the detail is what the reader came for)."""
        height = self.scrollable_content_region.height or self.size.height
        # The end of the detail on the last line when it all fits below some of the list; a
        # detail taller than the view starts at its top (its severity, id and title), the rest
        # a scroll away: the end alone said neither what the finding is nor what it is about.
        detail = len(self.findings) + 1 if self.findings else 0
        total = len(self.lines)
        if total - self.selected <= height:
            # The selected line, the list after it and the whole detail fit: the list ends
            # on the detail's last line (all of it when everything fits).
            y = max(0, total - height)
        else:
            y = min(total - height, detail)
        self.scroll_to(y=max(0, y), animate=False, immediate=True)

    def on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y
        if 0 <= index < len(self.findings):
            self.picked = True
            self.select(index)

    def on_resize(self) -> None:
        self._rebuild()
        self.show_selected()  # the panel grows or shrinks with the list: keep the detail in view

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._strips = {}

    def _rebuild(self) -> None:
        width = self.scrollable_content_region.width or self.size.width
        if width <= 0:
            return
        key = (tuple((f.id, f.gpu, f.pid, f.severity, f.title, f.evidence, f.fix,
                      getattr(f, "where", None), getattr(f, "next_step", None))
                     for f in self.findings),
               tuple(sorted(self.notes.items())), self.selected, width)
        if key == self._key:
            return
        self._key = key
        lines, _ = findings_lines(self.findings, self.notes, self.selected, width)
        self._strips = {}
        grown = len(lines) != len(self.lines)
        # A new virtual size lays the whole screen out again (~5 ms): while the same findings
        # stay selected at the same width, new numbers that wrap to a line fewer keep the
        # height (a blank line at the end) instead of shrinking it back and forth.
        same = (tuple(finding_key(f) for f in self.findings), self.selected, width)
        height = len(lines)
        if same == self._same and height < self.virtual_size.height:
            height = self.virtual_size.height
        self._same = same
        set_virtual_size(self, Size(width, height))
        self.lines = lines
        if grown:  # a finding raised or cleared, or the detail rewrapped: keep it in view
            self.show_selected()
            self.call_after_refresh(self.show_selected)
        self.refresh()

    def _style_map(self) -> dict[str | None, Style]:
        if self._styles is None:
            base = self.rich_style
            styles: dict[str | None, Style] = {None: base}
            for role, spec in _ROLE_STYLE.items():
                styles[role] = base + Style.parse(spec)
            styles["selected"] = base + self.get_component_rich_style("findings--selected",
                                                                      partial=True)
            self._styles = styles
        return self._styles

    def render_line(self, y: int) -> Strip:
        index = self.scroll_offset.y + y
        strip = self._strips.get(index)
        if strip is None:
            styles = self._style_map()
            width = self.scrollable_content_region.width or self.size.width
            if index >= len(self.lines):
                return Strip.blank(width, styles[None])
            line = self.lines[index]
            fill = styles["selected"] if line and line[0][1] == "selected" else styles[None]
            strip = Strip([Segment(t, styles.get(r, styles[None])) for t, r in line]
                          ).adjust_cell_length(width, fill)
            self._strips[index] = strip
        return strip


class FindingsPanel(FindingsView):
    """The view in a border, beside or below the process table."""

    DEFAULT_CSS = """
    FindingsPanel { border: round $secondary; height: 1fr; }
    FindingsPanel:focus { border: round $accent; }
    """

    def update_findings(self, findings: Sequence, notes: Mapping[tuple, str] | None = None
                        ) -> None:
        super().update_findings(findings, notes)
        title = f"findings ({len(self.findings)})" if self.findings else "findings"
        hint = " · Tab, ↑↓: select · f: full screen" if self.findings else ""
        if self.border_title != title + hint:
            self.border_title = title + hint


class FindingsBanner(TextLine):
    """Under 120 columns: the worst finding and the key that shows them all."""

    DEFAULT_CSS = """
    FindingsBanner { height: 1; padding: 0 1; background: $boost; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.findings: list = []

    def show_findings(self, findings: Sequence) -> None:
        self.findings = list(findings)
        self.rebuild()

    def rebuild(self) -> None:
        if self.size.width > 0:
            self.show_text(banner_text(self.findings, self.size.width - 2))


class FindingsScreen(Screen[None]):
    """`f`: every active finding at the terminal's full width, the selected one in full; the
    monitor keeps sampling underneath and the list follows it."""

    DEFAULT_CSS = """
    FindingsScreen { layout: vertical; }
    FindingsScreen #findings-title { height: 1; padding: 0 1; background: $panel; }
    FindingsScreen FindingsView { height: 1fr; padding: 0 1; }
    """
    BINDINGS = [
        Binding("escape,f,q", "close", "back"),
        Binding("up", "select(-1)", "previous"),
        Binding("down", "select(1)", "next"),
    ]

    def __init__(self, findings: Sequence, notes: Mapping[tuple, str] | None = None,
                 selected: int = 0) -> None:
        super().__init__()
        self.view = FindingsView(id="findings-view")
        self.view.findings = list(findings)
        self.view.notes = dict(notes or {})
        self.view.selected = selected
        self.title_line = TextLine(id="findings-title")

    def compose(self) -> ComposeResult:
        yield self.title_line
        yield self.view
        yield KeyFooter()

    def on_mount(self) -> None:
        self.update_findings(self.view.findings, self.view.notes)
        self.view.focus()

    def update_findings(self, findings: Sequence, notes: Mapping[tuple, str] | None = None
                        ) -> None:
        self.view.update_findings(findings, notes)
        n = len(self.view.findings)
        title = Text(f"findings ({n})" if n else "findings: none active", style="bold")
        if n:
            title.append("   ↑↓ select · the selected one in full below · Esc back",
                         style="dim")
        self.title_line.set_text(title)

    def action_select(self, step: int) -> None:
        self.view.action_select(step)

    def action_close(self) -> None:
        self.dismiss(None)
