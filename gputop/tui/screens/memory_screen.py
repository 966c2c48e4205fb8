"""After `m` on a training process: where its memory goes (the memory capture's report: what
grows by source line, the peak's parts, reserved versus allocated). The capture runs in a
thread worker through the capture service; this screen shows its progress and then the
report's text. Also shows a report given to it (an out-of-memory report, `M`)."""

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

from gputop.capture.memory.render import format_report
from gputop.core.format import safe_text
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine

STEPS = 3


class MemoryScreen(Screen[None]):
    DEFAULT_CSS = """
    MemoryScreen { layout: vertical; }
    MemoryScreen #memory-title { height: 1; padding: 0 1; background: $panel; }
    MemoryScreen #memory-status { height: auto; padding: 0 1; }
    MemoryScreen #memory-report {
        height: 1fr; border: round $secondary; padding: 0 1; scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [
        Binding("escape,q", "close", "back"),
        Binding("r", "recapture", "capture again"),
    ]

    def __init__(self, pid: int, command: str | None = None, *, timeout: float = 60.0,
                 report=None, path: str | None = None) -> None:
        """``report``: show this MemoryReport (an OOM's, or for screenshots) instead of
        capturing."""
        super().__init__()
        self.pid = pid
        self.command = command
        self.timeout = timeout
        self._given = (report, path) if report is not None else None
        self.body = Static(id="memory-body", expand=True)
        self.status = Static(id="memory-status")
        self.report = None  # the MemoryReport shown
        self.path: str | None = None
        self.error: str | None = None
        self.stage = "asking the agent"
        self._started = 0.0
        self._timer = None

    def compose(self) -> ComposeResult:
        what = ("out-of-memory report of pid" if self._given is not None
                and self._given[0].kind == "oom" else "memory of pid")
        title = Text(f"{what} {self.pid}", style="bold")
        if self.command:
            title.append(f"  {safe_text(self.command)[:100]}")
        yield TextLine(title, id="memory-title")
        yield self.status
        with VerticalScroll(id="memory-report") as box:
            box.border_title = "where the memory goes (scroll: arrows, PgUp/PgDn; r: again)"
            yield self.body
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#memory-report", VerticalScroll).focus()
        if self._given is not None:
            self._show(*self._given)
        else:
            self.action_recapture()

    def action_recapture(self) -> None:
        if self._given is not None:
            return  # a report after the fact: nothing to capture
        self._started = time.monotonic()
        self.stage = "asking the agent"
        self._show_progress()
        if self._timer is None:
            self._timer = self.set_interval(0.5, self._show_progress)
        self._capture()

    def _show_progress(self) -> None:
        elapsed = time.monotonic() - self._started
        self.status.update(Text(f"◷ memory capture of pid {self.pid} ({STEPS} steps): "
                                f"{self.stage} · {elapsed:.0f} s", style="bold"))

    def _stage(self, stage: str) -> None:
        self.stage = stage
        self._show_progress()

    @work(thread=True, exclusive=True, group="memory", exit_on_error=False)
    def _capture(self) -> None:
        from gputop.capture.service import MEMORY, CaptureFailed, CaptureSettings, capture
        from gputop.client.agents import progress_text

        worker = get_current_worker()

        def tell(method, *args) -> None:
            if not worker.is_cancelled:
                self.app.call_from_thread(method, *args)

        try:
            result = capture(self.pid, CaptureSettings(steps=STEPS, timeout=self.timeout,
                                                       sample_stacks=False),
                             kind=MEMORY, should_stop=lambda: worker.is_cancelled,
                             on_progress=lambda s: tell(self._stage, progress_text(s)))
        except CaptureFailed as exc:
            tell(self._failed, str(exc))
            return
        except Exception as exc:  # one line on screen, never a traceback
            tell(self._failed, f"{type(exc).__name__}: {exc}")
            return
        tell(self._show, result.report, result.path)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _show(self, report, path: str | None) -> None:
        self._stop_timer()
        self.report, self.path, self.error = report, path, None
        if report.kind == "capture":
            self.status.update(Text(f"recorded {report.steps} step(s) after a warm-up step",
                                    style="dim"))
            noted = getattr(self.app, "memory_captured", None)
            if noted is not None:
                noted(report)
        else:
            self.status.update(Text("the agent wrote this when the process ran out of memory",
                                    style="dim"))
        self.body.update(Text(format_report(report, path, self.command)))

    def _failed(self, message: str) -> None:
        self._stop_timer()
        self.error = safe_text(" ".join(message.split()))
        self.status.update(Text(self.error, style="bold red"))

    def action_close(self) -> None:
        self.workers.cancel_group(self, "memory")
        self.dismiss(None)
