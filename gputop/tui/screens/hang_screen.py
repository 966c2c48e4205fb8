"""After `h` on a job (or `p` on a hung one): why it is stuck. Every local rank's Flight
Recorder buffer and Python stack are collected at once by ``gputop.capture.hang`` on a thread
worker and joined by the attribution; this screen shows the progress and then the report's
text (the same as `gputop hang PID`)."""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Static
from textual.worker import get_current_worker

from gputop.core.format import safe_text
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine


class HangScreen(Screen[None]):
    DEFAULT_CSS = """
    HangScreen { layout: vertical; }
    HangScreen #hang-title { height: 1; padding: 0 1; background: $panel; }
    HangScreen #hang-status { height: auto; padding: 0 1; }
    HangScreen #hang-report {
        height: 1fr; border: round $secondary; padding: 0 1; scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [
        Binding("escape,q", "close", "back"),
        Binding("r", "collect", "collect again"),
    ]

    def __init__(self, pid: int, label: str | None = None) -> None:
        super().__init__()
        self.pid = pid
        self.label = label
        self.body = Static(id="hang-body", expand=True)
        self.status = Static(id="hang-status")
        self.text: str | None = None  # the last report's text
        self.error: str | None = None
        self._started = 0.0
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        title = Text("Why is it stuck: every rank's Flight Recorder and stack", style="bold")
        title.append(f"  {safe_text(self.label or f'pid {self.pid}')[:100]}")
        yield TextLine(title, id="hang-title")
        yield self.status
        with VerticalScroll(id="hang-report") as box:
            box.border_title = "hang attribution (scroll: arrows, PgUp/PgDn; r: collect again)"
            yield self.body
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#hang-report", VerticalScroll).focus()
        self.action_collect()

    def action_collect(self) -> None:
        self._started = time.monotonic()
        self._show_progress()
        if self._timer is None:
            self._timer = self.set_interval(0.5, self._show_progress)
        self._collect()

    def _show_progress(self) -> None:
        elapsed = time.monotonic() - self._started
        self.status.update(Text(f"◷ collecting every rank's Flight Recorder and stack · "
                                f"{elapsed:.0f} s", style="bold"))

    @work(thread=True, exclusive=True, group="hang", exit_on_error=False)
    def _collect(self) -> None:
        from gputop.capture.hang import HangError, collect
        from gputop.capture.hang_report import join, to_text

        worker = get_current_worker()
        try:
            text = to_text(join(collect(str(self.pid))))
        except HangError as exc:
            message = str(exc)
        except Exception as exc:  # one line on screen, never a traceback
            message = f"{type(exc).__name__}: {exc}"
        else:
            if not worker.is_cancelled:
                self.app.call_from_thread(self._show, text)
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._failed, message)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _show(self, text: str) -> None:
        self._stop_timer()
        self.text, self.error = text, None
        took = time.monotonic() - self._started
        self.status.update(Text(f"collected and joined in {took:.1f} s", style="dim"))
        self.body.update(Text(text))

    def _failed(self, message: str) -> None:
        self._stop_timer()
        self.error = safe_text(" ".join(message.split()))
        self.status.update(Text(self.error, style="bold red"))

    def action_close(self) -> None:
        self.workers.cancel_group(self, "hang")
        self.dismiss(None)
