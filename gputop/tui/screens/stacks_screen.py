"""After `p` on a process without the gputop agent: its Python stacks, sampled from outside
with py-spy (main process and DataLoader workers, active and idle, top functions and lines,
every thread's stack now). The sampling runs in a thread worker; this screen only shows its
progress and then lays out the report's text."""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import get_current_worker

from gputop.core.format import safe_text
from gputop.stacks.render import format_stacks
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine

SAMPLE_SECONDS = 2  # short enough that the view is filled within a few seconds of `p`
NO_AGENT = ("no gputop agent: py-spy samples (for a torch.profiler capture, start the job "
            "with `gputop run`)")


class StacksScreen(Screen[None]):
    DEFAULT_CSS = """
    StacksScreen { layout: vertical; }
    StacksScreen #stacks-title { height: 1; padding: 0 1; background: $panel; }
    StacksScreen #stacks-status { height: auto; padding: 0 1; }
    StacksScreen #stacks-report {
        height: 1fr; border: round $secondary; padding: 0 1; scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [
        Binding("escape,q", "close", "back"),
        Binding("r", "resample", "sample again"),
    ]

    def __init__(self, pid: int, command: str | None = None,
                 seconds: int = SAMPLE_SECONDS, report=None) -> None:
        """``report``: show this StackReport instead of sampling (screenshots)."""
        super().__init__()
        self.pid = pid
        self.command = command
        self.seconds = seconds
        self._given = report
        self.body = Static(id="stacks-body", expand=True)
        self.status = Static(id="stacks-status")
        self.report = None  # the last StackReport shown
        self.error: str | None = None
        self._started = 0.0
        self._timer = None

    def compose(self) -> ComposeResult:
        title = Text(f"Python stacks of pid {self.pid}", style="bold")
        if self.command:
            title.append(f"  {safe_text(self.command)[:100]}")
        yield TextLine(title, id="stacks-title")
        yield self.status
        with VerticalScroll(id="stacks-report") as box:
            box.border_title = "py-spy samples (scroll: arrows, PgUp/PgDn; r: sample again)"
            yield self.body
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#stacks-report", VerticalScroll).focus()
        if self._given is not None:
            self._show(self._given)
        else:
            self.action_resample()

    def action_resample(self) -> None:
        self._started = time.monotonic()
        self._show_progress()
        if self._timer is None:
            self._timer = self.set_interval(0.5, self._show_progress)
        self._sample()

    def _show_progress(self) -> None:
        elapsed = time.monotonic() - self._started
        self.status.update(Text(f"◷ sampling pid {self.pid} and its workers for "
                                f"{self.seconds} s with py-spy · {elapsed:.0f} s",
                                style="bold"))

    @work(thread=True, exclusive=True, group="stacks", exit_on_error=False)
    def _sample(self) -> None:
        from gputop.stacks.access import StacksError
        from gputop.stacks.pyspy import sample_stacks

        worker = get_current_worker()
        try:
            report = sample_stacks(self.pid, self.seconds,
                                   should_stop=lambda: worker.is_cancelled)
        except StacksError as exc:
            if not worker.is_cancelled:
                self.app.call_from_thread(self._failed, str(exc))
            return
        except Exception as exc:  # one line on screen, never a traceback
            if not worker.is_cancelled:
                self.app.call_from_thread(self._failed, f"{type(exc).__name__}: {exc}")
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._show, report)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _show(self, report) -> None:
        self._stop_timer()
        self.report, self.error = report, None
        self.status.update(Text(NO_AGENT, style="dim"))
        self.body.update(Text(format_stacks(report, self.command)))

    def _failed(self, message: str) -> None:
        self._stop_timer()
        self.error = safe_text(" ".join(message.split()))
        self.status.update(Text(self.error, style="bold red"))

    def action_close(self) -> None:
        self.workers.cancel_group(self, "stacks")
        self.dismiss(None)
