"""After `p`: the diagnosis of the captured steps (the `gputop analyze` report: where the step
time went, the findings with their fixes, top ops and kernels), with the trace's path and how
to open it. The analysis was made off the event loop; this screen only lays out its text."""

from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from gputop.diagnostics.findings import CATALOGUE
from gputop.diagnostics.trace import TraceAnalysis
from gputop.diagnostics.trace_report import format_report
from gputop.format import safe_text
from gputop.tui.widgets.text_line import TextLine

PERFETTO = "https://ui.perfetto.dev"


def title_text(pid: int, analysis: TraceAnalysis) -> Text:
    text = Text(f"diagnosis of pid {pid}: ", style="bold")
    if analysis.verdict == "healthy":
        text.append("healthy", style="bold green")
    else:
        text.append(analysis.verdict, style="bold yellow")
        text.append(f" - {CATALOGUE.get(analysis.verdict, '')}")
    return text


def open_text(trace: str) -> Text:
    """Where the trace is and the two ways to look at it."""
    trace = safe_text(trace)  # named by the agent: no terminal escapes
    text = Text("trace: ", style="bold")
    text.append(trace)
    text.append("\nopen it: ", style="bold")
    text.append(f"{PERFETTO} (Open trace file)  or  "
                f"tensorboard --logdir {os.path.dirname(trace) or '.'}")
    return text


class DiagnosisScreen(Screen[None]):
    DEFAULT_CSS = """
    DiagnosisScreen { layout: vertical; }
    DiagnosisScreen #diagnosis-title { height: 1; padding: 0 1; background: $panel; }
    DiagnosisScreen #diagnosis-trace { height: auto; padding: 0 1; }
    DiagnosisScreen #diagnosis-report {
        height: 1fr; border: round $secondary; padding: 0 1; scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [
        Binding("escape,q", "close", "back"),
    ]

    def __init__(self, pid: int, analysis: TraceAnalysis, trace: str, source: str = ""
                 ) -> None:
        super().__init__()
        self.pid = pid
        self.analysis = analysis
        self.trace = trace
        self.source = source  # the source lines of the top costs (already escaped), if any
        self.report = Static(id="diagnosis-body", expand=True)
        self._report_width = 0

    def compose(self) -> ComposeResult:
        yield TextLine(title_text(self.pid, self.analysis), id="diagnosis-title")
        yield Static(open_text(self.trace), id="diagnosis-trace")
        with VerticalScroll(id="diagnosis-report") as box:
            box.border_title = "steps captured by the agent (scroll: arrows, PgUp/PgDn)"
            yield self.report
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#diagnosis-report", VerticalScroll).focus()
        self._fit(self.app.size.width)

    def on_resize(self, event) -> None:
        self._fit(event.size.width)

    def _fit(self, screen_width: int) -> None:
        # The report wraps itself to a width: lay it out again when the terminal changes.
        width = max(60, screen_width - 5)
        if width != self._report_width:
            self._report_width = width
            text = format_report(self.analysis, width).rstrip("\n")
            if self.source:
                text += "\n\n" + self.source
            self.report.update(Text(text))

    def action_close(self) -> None:
        self.dismiss(None)
