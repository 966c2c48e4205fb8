"""The findings panel: each diagnosed cause with severity, title, evidence and fix, and under a
finding the result of a capture made for it (`--auto-capture`).

Renders any objects with the attributes of ``diagnostics.findings.Finding`` (.id .severity
.title .evidence .fix .gpu .pid). The text wraps to the panel's width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text
from textual.containers import VerticalScroll

from diagnostics.live import finding_key
from gputop.tui.severity import SEVERITY_MARK
from gputop.tui.widgets.text_line import StripWidget

_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "bold cyan"}


def findings_text(findings: Sequence, notes: Mapping[tuple, str] | None = None) -> Text:
    """The panel's text; ``notes`` maps a finding's (id, gpu, pid) to a line shown under it."""
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
        if f.evidence:
            out.append(f"\n{f.evidence}", style="dim")
        if f.fix:
            out.append("\nfix: ", style="bold")
            out.append(f.fix)
        note = notes.get(finding_key(f))
        if note:
            out.append("\n")
            out.append(note, style="bold")
    return out


class WrappedText(StripWidget):
    """Text wrapped to the widget's width; its height follows the wrapped lines."""

    DEFAULT_CSS = """
    WrappedText { height: auto; }
    """

    def __init__(self, text: Text, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.source = text

    def _wrapped(self, width: int) -> Text:
        if width <= 0:
            return self.source
        lines = self.source.wrap(self.app.console, width, overflow="fold")
        return Text("\n").join(lines)

    def set_source(self, text: Text) -> None:
        if text == self.source:
            return
        self.source = text
        self.rebuild()

    def rebuild(self) -> None:
        width = self.size.width
        if width > 0:
            self.show_text(self._wrapped(width))  # re-lays out when the line count changes

    def get_content_height(self, container, viewport, width: int) -> int:
        return self._wrapped(width).plain.count("\n") + 1


class FindingsPanel(VerticalScroll):
    DEFAULT_CSS = """
    FindingsPanel { border: round $secondary; height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "findings"
        self.findings: list = []
        self.notes: dict[tuple, str] = {}
        self._body = WrappedText(findings_text([]))

    def compose(self):
        yield self._body

    @property
    def text(self) -> Text:
        return self._body.source

    def update_findings(self, findings: Sequence, notes: Mapping[tuple, str] | None = None
                        ) -> None:
        """Show ``findings`` (most important first), each with its note if it has one; 'no
        findings' when the list is empty."""
        self.findings = list(findings)
        if notes is not None:
            self.notes = dict(notes)
        self.border_title = f"findings ({len(self.findings)})" if self.findings else "findings"
        self._body.set_source(findings_text(self.findings, self.notes))
