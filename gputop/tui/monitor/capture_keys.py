"""The monitor's keys that act on a live process: `k`, `p`, `h`, `m`, `F` and `M`. Each one
picks the selected row and hands the work to the capture controller (tui/monitor/captures.py) or opens
a screen; while a recording is played back each says why it cannot act, rather than doing
nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gputop.core.job_groups import jobs_in
from gputop.tui.monitor.replay_feed import ReplayFeed
from gputop.tui.monitor.signals import ask_and_signal

if TYPE_CHECKING:
    from gputop.tui.monitor.captures import CaptureController


class CaptureKeys:
    """Mixed into GputopApp: the key actions only; the App owns the widgets they read."""

    capture: CaptureController
    feed: Any
    frame: Any
    table: Any
    findings: Any

    if TYPE_CHECKING:
        def notify(self, *args: Any, **kwargs: Any) -> None: ...
        def push_screen(self, *args: Any, **kwargs: Any) -> Any: ...
        def _selected_pid(self, training: bool = False) -> int | None: ...

    readonly: bool = False

    def _replay_refuses(self, what: str) -> bool:
        """True (and a notification saying why) when this is a recording played back, or a
        monitor started with --readonly (no signals, no captures)."""
        if self.readonly:
            self.notify(f"{what}: gputop runs --readonly (no signals, no captures); start it "
                        "without --readonly for that", severity="warning", timeout=6,
                        markup=False)
            return True
        if not isinstance(self.feed, ReplayFeed):
            return False
        self.notify(f"{what}: this is a recording played back, its processes are not running "
                    "here (run `gputop` on the live machine for that)", severity="warning",
                    timeout=6, markup=False)
        return True

    def action_signal_process(self) -> None:
        """`k`: a signal (TERM, INT, KILL) to the selected process or the tagged ones, once
        chosen and confirmed."""
        if self._replay_refuses("cannot signal a process (k)"):
            return
        ask_and_signal(self, self.table.selected_row(), self.table.tagged_rows())

    def action_environment(self) -> None:
        """`e`: the selected process's full command line and environment (secrets masked)."""
        if isinstance(self.feed, ReplayFeed):
            self._replay_refuses("cannot read the environment (e)")
            return
        row = self.table.selected_row()
        if row is None:
            self.notify("no process selected", severity="warning", timeout=3)
            return
        from gputop.tui.screens.env_screen import EnvironmentScreen  # on first use: start-up

        self.push_screen(EnvironmentScreen(row.pid))

    def action_request_capture(self) -> None:
        """`p`: capture the selected process (every rank, on a job row) and diagnose it."""
        if self._replay_refuses("cannot capture (p)"):
            return
        row = self.table.selected_row()
        if row is not None and row.job is not None and any(
                f.id in ("hang", "rank-exited") and f.job == row.job
                for f in self.findings.findings):
            self.action_hang_report()  # a hung job: a profiler capture would wait forever
            return
        if row is not None and row.job is not None:  # the job row: every rank
            self.capture.request(row.pid, row.job)
            return
        pid = self._selected_pid(training=True)
        if pid is not None:
            self.capture.request(pid)

    def action_hang_report(self) -> None:
        """`h`: why the selected job is stuck (every rank's Flight Recorder and stack)."""
        if self._replay_refuses("cannot collect the ranks (h)"):
            return
        row = self.table.selected_row()
        pid = row.pid if row is not None and row.job is not None else self._selected_pid(True)
        if pid is not None:
            from gputop.tui.screens.hang_screen import HangScreen  # on first use: start-up

            self.push_screen(HangScreen(pid, row.job if row is not None else None))

    def action_memory_capture(self) -> None:
        """`m`: where the selected training process's memory goes (its agent's memory
        capture: growth by source line, the peak's parts, reserved versus allocated)."""
        if self._replay_refuses("cannot capture memory (m)"):
            return
        pid = self._selected_pid(training=True)
        if pid is not None:
            self.capture.memory(pid)

    def action_count_flops(self) -> None:
        """`F`: count the FLOPs of the selected process's next step again; on a job row, of
        every rank."""
        if self._replay_refuses("cannot count FLOPs (F)"):
            return
        row = self.table.selected_row()
        if row is not None and row.job is not None:
            job = next((j for j in jobs_in(self.frame.snapshot) if j.job_id == row.job), None) \
                if self.frame is not None else None
            pids = [r.pid for r in job.ranks] if job is not None else []
        else:
            pid = self._selected_pid(training=True)
            pids = [] if pid is None else [pid]
        self.capture.count_flops(pids)

    def action_last_oom(self) -> None:
        """`M`: the out-of-memory report of the last process with the agent that died of it."""
        self.capture.show_last_oom()
