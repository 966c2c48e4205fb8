"""The findings panel: each diagnosed cause with severity, title, evidence and fix.

Diagnostics arrive in a later issue; the panel already renders any objects with the attributes
of ``diagnostics.findings.Finding`` (.id .severity .title .evidence .fix .gpu .pid).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.containers import VerticalScroll

from gputop.tui.widgets.text_line import TextLine

_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "bold cyan"}
_SEVERITY_MARK = {"critical": "‼", "warning": "⚠", "info": "ℹ"}


def findings_text(findings: Sequence) -> Text:
    if not findings:
        return Text("no findings", style="dim")
    out = Text()
    for i, f in enumerate(findings):
        if i:
            out.append("\n\n")
        style = _SEVERITY_STYLE.get(f.severity, "bold")
        out.append(f"{_SEVERITY_MARK.get(f.severity, '•')} {f.severity} ", style=style)
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
    return out


class FindingsPanel(VerticalScroll):
    DEFAULT_CSS = """
    FindingsPanel { border: round $secondary; height: 1fr; }
    FindingsPanel > TextLine { height: auto; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "findings"
        self.findings: list = []
        self._body = TextLine(findings_text([]))

    def compose(self):
        yield self._body

    def update_findings(self, findings: list) -> None:
        """Show ``findings`` (most important first); 'no findings' when the list is empty."""
        self.findings = list(findings)
        self.border_title = f"findings ({len(self.findings)})" if self.findings else "findings"
        self._body.set_text(findings_text(self.findings))
        # The body's height follows its text: a new list is a (rare) layout change.
        self._body.refresh(layout=True)
