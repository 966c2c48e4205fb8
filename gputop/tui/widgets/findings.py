"""The findings panel: each diagnosed cause with severity, title, where in the code (once the
process's Python stacks named it), evidence and fix, and under a finding the result of a
capture made for it (`--auto-capture`).

Renders any objects with the attributes of ``diagnostics.findings.Finding`` (.id .severity
.title .evidence .fix .gpu .pid). The text wraps to the panel's width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputop.diagnostics.live import finding_key
from gputop.format import safe_text
from gputop.tui.severity import SEVERITY_MARK

_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "bold cyan"}


def findings_text(findings: Sequence, notes: Mapping[tuple, str] | None = None) -> Text:
    """The panel's text; ``notes`` maps a finding's (id, gpu, pid) to a line shown with it
    (under its title)."""
    if not findings:
        return Text("no findings", style="dim")
    notes = notes or {}
    out = Text()
    for i, f in enumerate(findings):
        if i:
            out.append("\n\n")
        style = _SEVERITY_STYLE.get(f.severity, "bold")
        out.append(f"{SEVERITY_MARK.get(f.severity, '•')} {f.severity} ", style=style)
        out.append(f.id, style="bold")
        where = []
        if getattr(f, "gpu", None) is not None:
            where.append(f"GPU {f.gpu}")
        if getattr(f, "pid", None) is not None:
            where.append(f"pid {f.pid}")
        if where:
            out.append("  " + " ".join(where), style="dim")
        out.append(f"\n{f.title}")
        located = getattr(f, "where", None)
        if located:  # the function behind it, from the process's Python stacks
            out.append("\nwhere: ", style="bold")
            out.append(safe_text(located))
        note = notes.get(finding_key(f))
        if note:  # right under the title: the proof is what the reader looks for first
            out.append("\n")
            out.append(note, style="bold")
        if f.evidence:
            out.append(f"\n{f.evidence}", style="dim")
        if f.fix:
            out.append("\nfix: ", style="bold")
            out.append(f.fix)
    return out


class FindingsPanel(ScrollView, can_focus=True):
    """The findings, wrapped to the panel's width and scrolled through the line API.

    A change of the virtual size lays the whole screen out again (~20 ms of CPU in the 8-GPU
    tour), and new evidence often wraps to one line more or less; so the virtual height is the
    panel's own while the text fits, and past that grows or shrinks in steps of VIRTUAL_STEP
    lines (the extra lines are blank): most updates only repaint the panel."""

    VIRTUAL_STEP = 8

    DEFAULT_CSS = """
    FindingsPanel {
        border: round $secondary; height: 1fr; scrollbar-size-vertical: 1;
        scrollbar-gutter: stable;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "findings"
        self.findings: list = []
        self.notes: dict[tuple, str] = {}
        self.text = findings_text([])
        self._lines: list[Text] = []
        self._strips: dict[int, Strip] = {}  # line index -> strip, made when first painted
        self._blank = Strip.blank(0)
        self._strips_key: tuple | None = None

    def update_findings(self, findings: Sequence, notes: Mapping[tuple, str] | None = None
                        ) -> None:
        """Show ``findings`` (most important first), each with its note if it has one; 'no
        findings' when the list is empty."""
        self.findings = list(findings)
        if notes is not None:
            self.notes = dict(notes)
        self.border_title = f"findings ({len(self.findings)})" if self.findings else "findings"
        text = findings_text(self.findings, self.notes)
        if text != self.text:
            self.text = text
            self._strips_key = None
            self._wrap()
            self.refresh()

    def on_resize(self) -> None:
        self._wrap()

    def _wrap(self) -> None:
        """Wrap the text for the current width (again only when it changed); lines become
        strips when they are first painted, so the ones scrolled out of view cost nothing."""
        region = self.scrollable_content_region
        style = self.rich_style
        key = (region.width, style, region.height)
        if region.width <= 0 or key == self._strips_key:
            return
        self._lines = list(self.text.wrap(self.app.console, region.width, overflow="fold"))
        self._strips = {}
        self._blank = Strip.blank(region.width, style)
        self._strips_key = key
        height = len(self._lines)
        if height <= region.height:
            height = region.height  # all in view: no scrolling
        else:
            height = -(-height // self.VIRTUAL_STEP) * self.VIRTUAL_STEP
        if self.virtual_size != (region.width, height):
            self.virtual_size = Size(region.width, height)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips_key = None  # a new theme: the base style of the strips changed

    def render_line(self, y: int) -> Strip:
        if self._strips_key is None:
            self._wrap()
        index = self.scroll_offset.y + y
        strip = self._strips.get(index)
        if strip is None:
            if index >= len(self._lines):
                return self._blank
            width, style, _ = self._strips_key
            line = self._lines[index].render(self.app.console)
            strip = Strip(list(line)).apply_style(style).crop_extend(0, width, style)
            self._strips[index] = strip
        return strip
