"""The live monitor's captures, beside the App: one controller for every kind of capture.

``p`` (a trace capture, or every rank of a job), ``m`` (a memory capture, on its own screen),
``F`` (a FLOP count), ``--auto-capture`` (a trace when a stall raises) and the out-of-memory
reports of agents that ended all start here. Each capture is one ``CaptureRun`` in one state
machine (``running`` with a stage -> done or failed, then gone); the work runs in thread
workers that report back only through the typed messages below, handled here on the event
loop. The App draws: it gives this controller its keys and its frames, and the controller
asks it to show a line, a note under a finding, a notice or a screen.

A key another feature adds (``h`` for hangs, say) is one more ``start``-style method here and
one ``action_`` line in the App.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rich.text import Text
from textual import work
from textual.message import Message
from textual.widget import Widget
from textual.worker import get_current_worker

from gputop.core.format import safe_text
from gputop.core.job_groups import JobView, jobs_in
from gputop.core.model import Snapshot
from gputop.diagnostics.findings import finding_key
from gputop.tui.monitor.auto_capture import AutoCapturePolicy
from gputop.tui.view.rows import groups

if TYPE_CHECKING:
    from gputop.capture.memory.report import MemoryReport
    from gputop.diagnostics.trace.analysis import TraceAnalysis
    from gputop.tui.screens.job_screen import JobResult

CAPTURE_STEPS = 3
Kind = Literal["trace", "job"]
Severity = Literal["information", "warning", "error"]


@dataclass
class CaptureRun:
    """A capture in flight: its kind, which process (or job), for which finding (None: a key),
    since when, and the stage it is at."""

    pid: int
    finding: tuple | None
    started: float
    stage: str = "asking the agent"
    kind: Kind = "trace"
    key: int | str = field(default=0)


# -- what the workers report back -----------------------------------------------------------


class _Report(Message, bubble=False):
    """A worker's report to the controller (it stays there: the App does not see it)."""


class Progress(_Report):
    def __init__(self, kind: Kind, key: int | str, stage: str) -> None:
        super().__init__()
        self.kind, self.key, self.stage = kind, key, stage


class Failed(_Report):
    def __init__(self, kind: Kind, key: int | str, message: str) -> None:
        super().__init__()
        self.kind, self.key, self.message = kind, key, message


class TraceCaptured(_Report):
    def __init__(self, pid: int, trace: str, analysis: TraceAnalysis, source: str) -> None:
        super().__init__()
        self.pid, self.trace, self.analysis, self.source = pid, trace, analysis, source


class JobCaptured(_Report):
    def __init__(self, result: JobResult) -> None:
        super().__init__()
        self.result = result


class AgentLookedUp(_Report):
    """Whether ``pid`` has an agent we can reach, for ``purpose`` (``p`` or ``m``); without one,
    why py-spy cannot sample it either (None: it can)."""

    def __init__(self, pid: int, purpose: Literal["capture", "memory"], has_agent: bool,
                 pyspy_problem: str | None) -> None:
        super().__init__()
        self.pid, self.purpose, self.has_agent = pid, purpose, has_agent
        self.pyspy_problem = pyspy_problem


class OomFound(_Report):
    def __init__(self, pid: int, report: MemoryReport, path: str) -> None:
        super().__init__()
        self.pid, self.report, self.path = pid, report, path


class Notice(_Report):
    def __init__(self, text: str, severity: Severity = "information", timeout: float = 8) -> None:
        super().__init__()
        self.text, self.severity, self.timeout = text, severity, timeout


def home_short(path: str) -> str:
    """``path`` with the home directory as ~ (the findings panel is narrow)."""
    import os

    home = os.path.expanduser("~")
    if home not in ("", "/") and path.startswith(home + os.sep):
        return "~" + path[len(home):]
    return path


class CaptureController(Widget):
    """Every capture of the live monitor (see the module's docstring). Never drawn."""

    DEFAULT_CSS = "CaptureController { display: none; }"

    def __init__(self, *, auto_capture: bool, timeout: float, live: bool) -> None:
        super().__init__(id="capture-controller")
        self.auto = AutoCapturePolicy() if auto_capture else None
        self.timeout = timeout
        self.live = live  # sampling live processes (not a fixed sequence, not a replay)
        self.runs: dict[tuple[Kind, int | str], CaptureRun] = {}
        self.notes: dict[tuple, str] = {}  # finding key -> the line under it
        # Out-of-memory reports of processes with the agent that ended (`M` shows the last).
        self.agent_pids: dict[int, float | None] = {}  # pid -> create time, last frame
        self.ooms: dict[int, tuple[MemoryReport, str]] = {}  # pid -> (report, path)
        self.last_oom: int | None = None
        self.snapshot: Snapshot | None = None
        self._timer: Any = None

    @property
    def traces(self) -> dict[int, CaptureRun]:
        """The trace captures running, by pid."""
        return {run.pid: run for (kind, _), run in self.runs.items() if kind == "trace"}

    # -- frames -------------------------------------------------------------------------------

    def new_frame(self, snap: Snapshot, findings: Any) -> None:
        """Each frame: auto-captures that are due, and agents that went away (an OOM?)."""
        self.snapshot = snap
        if self.auto is not None:
            with_agent = {g.proc.pid for g in groups(snap) if g.proc.agent}
            for f in self.auto.due(findings, with_agent):
                self.start_trace(f.pid, finding_key(f))
        if self.live:
            now = {g.proc.pid: g.proc.create_time for g in groups(snap) if g.proc.agent}
            for pid, started in self.agent_pids.items():
                if pid not in now:
                    self._look_for_oom(pid, started)
            self.agent_pids = now

    def keep_notes(self, active: set[tuple]) -> dict[tuple, str]:
        """A note belongs to its finding: it goes when the finding clears (unless its capture
        is still running)."""
        running = {run.finding for run in self.runs.values()}
        self.notes = {k: v for k, v in self.notes.items() if k in active or k in running}
        return self.notes

    # -- keys ---------------------------------------------------------------------------------

    def request(self, pid: int, job_id: str | None = None) -> None:
        """`p`: the job row captures every rank; a process with an agent is captured (every
        rank, when it is one); without one its Python stacks are sampled (py-spy)."""
        if job_id is not None:
            self.start_job(job_id, pid)
        else:
            self._look_up_agent(pid, "capture")

    def memory(self, pid: int) -> None:
        """`m`: a memory capture of ``pid``, on its own screen, if it has the agent."""
        self._look_up_agent(pid, "memory")

    def count_flops(self, pids: list[int]) -> None:
        """`F`: count the FLOPs of each process's next step again (its agent's
        FlopCounterMode), for MFU."""
        for pid in pids:
            self.app.notify(f"counting the FLOPs of pid {pid}'s next step", timeout=3)
            self._count_flops(pid)

    def show_last_oom(self) -> None:
        """`M`: the out-of-memory report of the last process with the agent that died of it."""
        if self.last_oom is None:
            self.app.notify("no process with the agent has run out of memory since gputop "
                            "started (gputop memory --last-oom PID reads an older one)",
                            timeout=6)
            return
        from gputop.tui.screens.memory_screen import MemoryScreen

        report, path = self.ooms[self.last_oom]
        self.app.push_screen(MemoryScreen(self.last_oom, report=report, path=path))

    # -- the state machine --------------------------------------------------------------------

    def start_trace(self, pid: int, finding: tuple | None) -> None:
        """A trace capture of ``pid``, for ``finding`` (an auto-capture) or for `p`."""
        if ("trace", pid) in self.runs:
            self.app.notify(f"a capture of pid {pid} is already running", severity="warning",
                            timeout=4)
            return
        self.runs[("trace", pid)] = CaptureRun(pid, finding, time.monotonic(), key=pid)
        if finding is None:
            if self.auto is not None:
                self.auto.record(pid)
            self.app.notify(f"capture requested for pid {pid}: recording {CAPTURE_STEPS} "
                            "steps", timeout=4)
        else:
            self._set_note(finding, "capture: running…")
        self._started()
        self._run_trace(pid)

    def start_job(self, job_id: str, pid: int) -> None:
        """Record the same steps on every rank of the job, then show the ranks side by side."""
        if ("job", job_id) in self.runs:
            self.app.notify(f"a capture of job {safe_text(job_id)} is already running",
                            severity="warning", timeout=4)
            return
        self.runs[("job", job_id)] = CaptureRun(pid, None, time.monotonic(), "asking the ranks",
                                                kind="job", key=job_id)
        self.app.notify(f"capture requested for every rank of job {safe_text(job_id)}: "
                        f"recording {CAPTURE_STEPS} steps", timeout=4)
        self._started()
        self._run_job(job_id, pid)

    def _started(self) -> None:
        if self._timer is None:
            self._timer = self.set_interval(1.0, self.show_status)
        self.show_status()

    def show_status(self) -> None:
        """The status line above the process table, with the elapsed seconds."""
        line = self.app.capture_line  # type: ignore[attr-defined]
        if not self.runs:
            line.display = False
            if self._timer is not None:
                self._timer.stop()
                self._timer = None
            return
        now = time.monotonic()
        parts = []
        for run in self.runs.values():
            if run.kind == "trace":
                who = "auto-capture" if run.finding is not None else "capture"
                parts.append(f"{who} of pid {run.pid}: {run.stage} · {now - run.started:.0f} s")
        for run in self.runs.values():
            if run.kind == "job":
                parts.append(f"capture of job {safe_text(str(run.key))[:40]}: "
                             f"{safe_text(run.stage)} · {now - run.started:.0f} s")
        line.set_text(Text("◷ " + "   ".join(parts), style="bold"))
        line.display = True

    def _set_note(self, finding: tuple, note: str) -> None:
        self.notes[finding] = note
        panel = self.app.findings  # type: ignore[attr-defined]
        panel.update_findings(panel.findings, self.notes)

    def on_progress(self, message: Progress) -> None:
        run = self.runs.get((message.kind, message.key))
        if run is not None:
            run.stage = message.stage
            self.show_status()

    def on_failed(self, message: Failed) -> None:
        run = self.runs.pop((message.kind, message.key), None)
        self.show_status()
        line = safe_text(" ".join(message.message.split()))  # one line, whatever was said
        if run is not None and run.finding is not None:
            self._set_note(run.finding, f"capture failed: {line}")
        self.app.notify(line, severity="error", timeout=8)

    def on_trace_captured(self, message: TraceCaptured) -> None:
        pid, analysis, trace = message.pid, message.analysis, message.trace
        run = self.runs.pop(("trace", pid), None)
        self.show_status()
        if run is not None and run.finding is not None:
            self._set_note(run.finding, f"capture: {analysis.verdict}, trace {home_short(trace)}")
            self.app.notify(f"auto-capture of pid {pid}: {analysis.verdict}; trace {trace}",
                            timeout=8)
            return
        self.app.show_diagnosis(pid, analysis, trace, message.source)  # type: ignore[attr-defined]

    def on_job_captured(self, message: JobCaptured) -> None:
        self.runs.pop(("job", message.result.job_id), None)
        self.show_status()
        from gputop.tui.screens.job_screen import JobScreen

        self.app.push_screen(JobScreen(message.result))

    def on_agent_looked_up(self, message: AgentLookedUp) -> None:
        pid = message.pid
        if message.purpose == "memory":
            if message.has_agent:
                self._show_memory(pid)
            else:
                from gputop.client.agents import no_agent_hint

                self.app.notify(f"{no_agent_hint(pid)}: a memory capture needs the agent",
                                severity="warning", timeout=8)
            return
        if message.has_agent:
            job = self.job_of(pid)
            if job is not None:
                self.start_job(job.job_id, pid)
            else:
                self.start_trace(pid, None)
        elif message.pyspy_problem is None:
            self._show_stacks(pid)
        else:
            from gputop.client.agents import no_agent_hint

            self.app.notify(f"{no_agent_hint(pid)}; py-spy: {safe_text(message.pyspy_problem)}",
                            severity="warning", timeout=8)

    def on_oom_found(self, message: OomFound) -> None:
        pid, report = message.pid, message.report
        self.ooms[pid] = (report, message.path)
        self.last_oom = pid
        where = report.oom.where.location() if report.oom.where is not None else None
        self.app.notify(safe_text(f"pid {pid} ran out of memory"
                                  + (f" at {where}" if where else "")
                                  + ": M shows what held the memory"), severity="error",
                        timeout=30)

    def on_notice(self, message: Notice) -> None:
        self.app.notify(message.text, severity=message.severity, timeout=message.timeout)

    # -- screens ------------------------------------------------------------------------------

    def command_of(self, pid: int) -> str | None:
        for group in groups(self.snapshot) if self.snapshot is not None else ():
            if group.proc.pid == pid:
                return group.proc.cmdline or group.proc.name
        return None

    def job_of(self, pid: int) -> JobView | None:
        """The distributed job (two or more ranks on this node) that ``pid`` is a rank or the
        launcher of, from the newest frame; None for a lone process."""
        if self.snapshot is None:
            return None
        for job in jobs_in(self.snapshot):
            if len(job.ranks) >= 2 and (pid in job.pids or pid == job.launcher_pid):
                return job
        return None

    def _show_memory(self, pid: int) -> None:
        from gputop.tui.screens.memory_screen import MemoryScreen  # on first use: start-up

        if not isinstance(self.app.screen, MemoryScreen):
            self.app.push_screen(MemoryScreen(pid, self.command_of(pid), timeout=self.timeout))

    def _show_stacks(self, pid: int) -> None:
        """`p` on a process without the agent: its Python stacks (py-spy) on a screen."""
        from gputop.tui.screens.stacks_screen import StacksScreen  # on first use: start-up

        if not isinstance(self.app.screen, StacksScreen):
            self.app.push_screen(StacksScreen(pid, self.command_of(pid)))

    # -- the workers (off the event loop; they report through messages) ----------------------

    def _teller(self) -> Callable[[Message], None]:
        """For a worker: report ``message`` to the controller (from any thread: the capture
        service calls back from its own), unless the app is leaving."""
        worker = get_current_worker()

        def tell(message: Message) -> None:
            if not worker.is_cancelled:  # the app is leaving: nobody to tell
                self.post_message(message)

        return tell

    @work(thread=True, group="actions", exit_on_error=False)
    def _look_up_agent(self, pid: int, purpose: Literal["capture", "memory"]) -> None:
        """Listing agents reads a socket directory."""
        tell = self._teller()
        from gputop.client import agents as client

        try:  # also in a container, from the host, or in a namespace beside ours
            has_agent = pid in client.list_agents() or client.find_agent(pid) is not None
        except Exception:  # an unreadable socket directory: no agent we can reach
            has_agent = False
        problem = None
        if not has_agent and purpose == "capture":
            from gputop.stacks.pyspy import unusable_reason

            problem = unusable_reason(pid)  # no agent: its Python stacks from outside?
        tell(AgentLookedUp(pid, purpose, has_agent, problem))

    @work(thread=True, group="capture", exit_on_error=False)
    def _run_trace(self, pid: int) -> None:
        """The capture service records the steps (the bounded defaults of `gputop capture`)
        and analyses the trace."""
        tell = self._teller()
        from gputop.capture.service import CaptureFailed, CaptureSettings, capture
        from gputop.client.agents import progress_text

        worker = get_current_worker()
        shown = [""]

        def progress(status: dict) -> None:
            stage = progress_text(status)
            if stage != shown[0]:
                shown[0] = stage
                tell(Progress("trace", pid, stage))

        try:
            result = capture(pid, CaptureSettings(steps=CAPTURE_STEPS, timeout=self.timeout),
                             on_progress=progress, should_stop=lambda: worker.is_cancelled)
        except CaptureFailed as exc:
            tell(Failed("trace", pid, str(exc)))
            return
        except Exception as exc:  # never a traceback on screen: one line, and go on
            tell(Failed("trace", pid, f"capture of pid {pid} failed: {exc}"))
            return
        if result.analysis is None:
            tell(Failed("trace", pid, result.failure()))
            return
        for note in result.notes:
            tell(Notice(safe_text(note), "warning"))
        tell(TraceCaptured(pid, result.trace, result.analysis, result.source_text()))

    @work(thread=True, group="capture", exit_on_error=False)
    def _run_job(self, job_id: str, pid: int) -> None:
        """Every rank records the same steps, each trace is analysed, the ranks compared."""
        tell = self._teller()
        from gputop.capture.service import CaptureFailed, CaptureSettings, capture_job
        from gputop.tui.screens.job_screen import JobResult

        worker = get_current_worker()
        try:
            done = capture_job(pid, CaptureSettings(steps=CAPTURE_STEPS, timeout=self.timeout),
                               on_progress=lambda text: tell(Progress("job", job_id, text)),
                               should_stop=lambda: worker.is_cancelled)
        except CaptureFailed as exc:
            tell(Failed("job", job_id, f"capture of job {job_id} failed: {exc}"))
            return
        except Exception as exc:  # never a traceback on screen
            tell(Failed("job", job_id,
                              f"capture of job {job_id} failed: {type(exc).__name__}: {exc}"))
            return
        result = done.capture
        failed = [f"rank {rc.agent.rank} (pid {rc.agent.pid}): {rc.error}"
                  for rc in result.failed]
        first = next((rc.reply.get("first_recorded_step") for rc in result.captured), None)
        tell(JobCaptured(JobResult(job_id, str(result.directory),
                                         first if isinstance(first, int) else None,
                                         done.cross, failed, done.problems)))

    @work(thread=True, group="flops", exit_on_error=False)
    def _count_flops(self, pid: int) -> None:
        """The agent answers once the counted step has ended."""
        tell = self._teller()
        from gputop.client.agents import AgentError, request_flop_count
        from gputop.core.efficiency import flops_text

        try:
            reply = request_flop_count(pid)
        except (AgentError, OSError) as exc:
            tell(Notice(safe_text(str(exc)), "warning"))
            return
        cost = reply.get("cost_s")
        tell(Notice(f"pid {pid}: {flops_text(reply.get('flops_per_step'))} per step "
                          f"({safe_text(str(reply.get('precision')))}), counted at step "
                          f"{reply.get('step')}"
                          + (f"; counting cost the job {cost * 1000:.0f} ms"
                             if isinstance(cost, (int, float)) else "")))

    @work(thread=True, group="oom", exit_on_error=False)
    def _look_for_oom(self, pid: int, started: float | None) -> None:
        """A process with the agent that is gone may have died of an out-of-memory error: its
        agent then wrote a report."""
        tell = self._teller()
        from gputop.capture.memory.oom_files import last_oom_of

        found = last_oom_of(pid)  # only a report its user (or root) wrote, naming this pid
        if found is None:
            return
        path, report = found
        if report.kind != "oom" or (started is not None and report.time < started - 1.0):
            return  # an earlier process's, with the same pid
        tell(OomFound(pid, report, path))
