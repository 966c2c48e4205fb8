"""After `p`: the diagnosis of the captured steps as a picture (gputop/tui/view/diagnosis_view.py):
the verdict, where the step time went in colour, the findings with their fixes, the top
kernels and ops, the trace's path and how to open it. The analysis was made off the event
loop; this screen only lays it out (again on a resize). Its footer lists its own keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from gputop.diagnostics.trace.analysis import TraceAnalysis
from gputop.tui.view.diagnosis_view import PERFETTO, diagnosis_renderable, open_text, title_text
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine

__all__ = ["DiagnosisScreen", "PERFETTO", "open_text", "title_text"]


class DiagnosisScreen(Screen[None]):
    DEFAULT_CSS = """
    DiagnosisScreen { layout: vertical; }
    DiagnosisScreen #diagnosis-title { height: 1; padding: 0 1; background: $panel; }
    DiagnosisScreen #diagnosis-report {
        height: 1fr; border: round $secondary; padding: 0 1; scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [
        Binding("escape,q", "close", "Back"),
        Binding("down", "scroll('down')", "Scroll", key_display="↑↓"),
        Binding("up", "scroll('up')", "Scroll up", show=False),
        Binding("pagedown", "page('down')", "Page", key_display="PgUp/PgDn"),
        Binding("pageup", "page('up')", "Page up", show=False),
        Binding("home", "top", "Top"),
        Binding("end", "bottom", "End"),
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
        with VerticalScroll(id="diagnosis-report") as box:
            box.border_title = "steps captured by the agent"
            box.can_focus = False  # the screen's keys scroll it, and its footer lists them
            yield self.report
        yield KeyFooter()

    def on_mount(self) -> None:
        self._fit(self.app.size.width)

    def on_resize(self, event) -> None:
        self._fit(event.size.width)

    def _fit(self, screen_width: int) -> None:
        # Laid out for a width: again when the terminal changes.
        width = max(40, screen_width - 5)
        if width != self._report_width:
            self._report_width = width
            self.report.update(diagnosis_renderable(self.analysis, self.trace, width,
                                                    self.source))

    def _box(self) -> VerticalScroll:
        return self.query_one("#diagnosis-report", VerticalScroll)

    def action_scroll(self, direction: str) -> None:
        box = self._box()
        box.scroll_down() if direction == "down" else box.scroll_up()

    def action_page(self, direction: str) -> None:
        box = self._box()
        box.scroll_page_down() if direction == "down" else box.scroll_page_up()

    def action_top(self) -> None:
        self._box().scroll_home(animate=False)

    def action_bottom(self) -> None:
        self._box().scroll_end(animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
