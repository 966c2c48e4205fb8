"""After `p` on a remote job: the diagnosis the node's gputop made of the captured steps, the
trace's place on the node and the command that fetches it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from gputop.diagnostics.findings import CATALOGUE
from gputop.fleet.capture import RemoteCapture, report_text
from gputop.tui.screens.diagnosis_screen import PERFETTO
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine


def remote_title(capture: RemoteCapture) -> Text:
    text = Text(f"diagnosis of pid {capture.pid} on {capture.host}: ", style="bold")
    if capture.verdict == "healthy":
        text.append("healthy", style="bold green")
    else:
        text.append(capture.verdict, style="bold yellow")
        meaning = CATALOGUE.get(capture.verdict)
        if meaning:
            text.append(f" - {meaning}")
    return text


def fetch_text(capture: RemoteCapture) -> Text:
    text = Text("trace (on the node): ", style="bold")
    text.append(f"{capture.host}:{capture.trace}")
    text.append("\nfetch it: ", style="bold")
    text.append(f"{capture.fetch_command}   then open it in {PERFETTO}")
    return text


class RemoteDiagnosisScreen(Screen[None]):
    DEFAULT_CSS = """
    RemoteDiagnosisScreen { layout: vertical; }
    RemoteDiagnosisScreen #remote-title { height: 1; padding: 0 1; background: $panel; }
    RemoteDiagnosisScreen #remote-trace { height: auto; padding: 0 1; }
    RemoteDiagnosisScreen #remote-report {
        height: 1fr; border: round $secondary; padding: 0 1; scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [Binding("escape,q", "close", "back")]

    def __init__(self, capture: RemoteCapture) -> None:
        super().__init__()
        self.capture = capture
        self.report = Static(id="remote-body", expand=True)
        self._width = 0

    def compose(self) -> ComposeResult:
        yield TextLine(remote_title(self.capture), id="remote-title")
        yield Static(fetch_text(self.capture), id="remote-trace")
        with VerticalScroll(id="remote-report") as box:
            box.border_title = "steps captured on the node (scroll: arrows, PgUp/PgDn)"
            yield self.report
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#remote-report", VerticalScroll).focus()
        self._fit(self.app.size.width)

    def on_resize(self, event) -> None:
        self._fit(event.size.width)

    def _fit(self, screen_width: int) -> None:
        width = max(60, screen_width - 5)
        if width != self._width:
            self._width = width
            self.report.update(Text(report_text(self.capture, width)))

    def action_close(self) -> None:
        self.dismiss(None)
