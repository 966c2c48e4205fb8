"""Capture a training process through its agent, and diagnose what it recorded: arm, wait,
fetch, analyse; for one process (``capture``) or every rank of a job (``capture_job``).

Under the command line and the TUI, never above them: nothing here prints or draws. Every
call blocks (the TUI runs it in a worker thread); progress goes to ``on_progress`` and
``should_stop()`` abandons a capture (the agent cancels it). Failures are ``CaptureFailed``
with one line.

A capture is of one *kind*: how the agent is asked, what runs beside it while it records,
and how its result is read. ``TRACE`` (torch.profiler steps, with py-spy sampling the stacks
meanwhile) and ``MEMORY`` (the allocations of a few steps: what grows, what makes the peak,
reserved versus allocated; ``gputop memory``, `m`) are the kinds there are; each is a
``CaptureKind`` with its own ``message``, ``begin``, ``result`` and ``abort``, and
``capture(pid, settings, kind=...)`` runs it the same way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gputop.client import namespaces
from gputop.client.agents import AgentError, partial_note, request_capture, trace_limits

if TYPE_CHECKING:  # what the results hold, typed (mypy checks this boundary strictly)
    from gputop.capture.memory.report import MemoryReport
    from gputop.client.jobs import JobCapture, RankCapture
    from gputop.diagnostics.trace.analysis import TraceAnalysis
    from gputop.diagnostics.trace.ranks import CrossRank
    from gputop.stacks.timeline import Timeline, TimelineRecorder

DEFAULT_STEPS = 3
DEFAULT_TIMEOUT_S = 60.0
# The py-spy sampling beside a capture ends at the latest this long after the capture's own
# deadline (the agent's reply margin and the export).
SAMPLING_MARGIN_S = 45.0

Progress = Callable[[dict[str, Any]], None]  # the agent's status["capture"]
ShouldStop = Callable[[], bool]


class CaptureFailed(Exception):
    """The capture gave nothing to analyse; the message is one line, for the user."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class CaptureSettings:
    """What to record. The defaults are the bounded capture (README "What a capture costs"):
    no Python tracer, shapes or memory events; py-spy says where in the code instead."""

    steps: int | None = None  # None: DEFAULT_STEPS (with seconds unset)
    seconds: float | None = None  # a time window of all threads instead of steps
    warmup: int | None = None  # None: the agent's default (1)
    timeout: float = DEFAULT_TIMEOUT_S
    out: str | None = None  # directory; None: $GPUTOP_CAPTURE_DIR or the agent's default
    with_stack: bool = False
    record_shapes: bool = False
    profile_memory: bool = False
    sample_stacks: bool = True  # py-spy on the process and its workers while it records

    def out_dir(self) -> str | None:
        """Where the agent writes: ``out``, else $GPUTOP_CAPTURE_DIR, else its default."""
        out = self.out or os.environ.get("GPUTOP_CAPTURE_DIR")
        return os.path.abspath(os.path.expanduser(out)) if out else None

    def message(self) -> dict[str, Any]:
        """The agent's ``capture`` request."""
        message: dict[str, Any] = {"cmd": "capture", "timeout": self.timeout}
        if self.seconds is not None:
            message["seconds"] = self.seconds
        else:
            message["steps"] = DEFAULT_STEPS if self.steps is None else self.steps
            if self.warmup is not None:
                message["warmup"] = self.warmup
        out = self.out_dir()
        if out:
            message["out"] = out
        for name in ("with_stack", "record_shapes", "profile_memory"):
            if getattr(self, name):
                message[name] = True
        return message


@dataclass
class CaptureResult:
    pid: int
    reply: dict[str, Any]
    trace: str
    analysis: TraceAnalysis | None = None  # None when the trace could not be analysed
    error: str | None = None  # why not (one line)
    wheres: list = field(default_factory=list)  # trace_join.FindingWhere, from py-spy
    stack_lines: list = field(default_factory=list)  # stack_lines.CostLines (with_stack)
    notes: list[str] = field(default_factory=list)  # what the user should know, one line each
    stacks_rate: int = 0
    replied_wall: float = field(default_factory=time.time)  # when the agent's reply came

    def failure(self) -> str:
        """Why there is no analysis, in one line (empty when there is one)."""
        if self.analysis is not None:
            return ""
        if self.reply.get("mode") == "seconds" and self.notes and "torch operator" in (
                self.error or ""):
            return self.error or ""
        return f"cannot analyze {self.trace}: {self.error}"

    def source_text(self) -> str:
        """The report's sections on where in the code the time went (escaped), or ""."""
        from gputop.diagnostics.stack_lines import format_source_lines
        from gputop.stacks.trace_join import format_where

        parts = [format_where(self.wheres, self.stacks_rate),
                 format_source_lines(self.stack_lines)]
        return "\n\n".join(p for p in parts if p)

    def to_json(self) -> dict[str, Any]:
        if self.analysis is not None:
            data = self.analysis.to_json()
        else:
            data = {"error": self.error}
        data["trace"] = self.trace
        data["source_lines"] = ([w.to_json() for w in self.wheres]
                                + [c.to_json() for c in self.stack_lines])
        data["notes"] = list(self.notes)
        data["capture"] = {key: self.reply.get(key) for key in (
            "mode", "steps", "recorded_steps", "warmup", "seconds", "bytes", "budget_bytes",
            "profiler_json_bytes", "start_step", "first_recorded_step", "summary",
            "profiler_started_wall", "walls")}
        data["capture"]["replied_wall"] = round(self.replied_wall, 6)
        return data


class CaptureKind(Protocol):
    name: str
    path_key: str  # the reply's field naming the file the agent wrote

    def message(self, settings: CaptureSettings) -> dict[str, Any]: ...

    def begin(self, pid: int, settings: CaptureSettings) -> Any: ...

    def progress(self, side: Any, status: dict[str, Any]) -> None: ...

    def result(self, pid: int, settings: CaptureSettings, reply: dict[str, Any],
               side: Any) -> Any: ...  # CaptureResult, MemoryResult: with replied_wall

    def abort(self, side: Any) -> None: ...


def capture(pid: int, settings: CaptureSettings = CaptureSettings(), *,
            kind: CaptureKind | None = None, on_progress: Progress | None = None,
            should_stop: ShouldStop | None = None) -> Any:
    """Record ``pid`` as ``settings`` say and read the result; ``CaptureFailed`` when there is
    nothing to read (no agent, the process exited before a step was recorded, a timeout)."""
    kind = kind or TRACE
    side = kind.begin(pid, settings)

    namespaces.wire()  # agents in containers too

    def progress(status: dict[str, Any]) -> None:
        kind.progress(side, status)
        if on_progress is not None:
            on_progress(status)

    try:
        reply = request_capture(pid, timeout=settings.timeout, message=kind.message(settings),
                                on_progress=progress, should_stop=should_stop,
                                path_key=kind.path_key)
    except AgentError as exc:
        kind.abort(side)
        from gputop.core.format import safe_text

        raise CaptureFailed(safe_text(" ".join(str(exc).split())), exc.code) from None
    except BaseException:
        kind.abort(side)
        raise
    replied = time.time()
    result = kind.result(pid, settings, reply, side)
    result.replied_wall = replied
    return result


def process_cmdline(pid: int) -> list[str] | None:
    """The command line of the captured process, for next steps that relaunch it under a
    profiler (None when it cannot be read)."""
    try:
        import psutil

        return psutil.Process(pid).cmdline() or None
    except Exception:
        return None


class TraceCapture:
    """torch.profiler steps (or a time window), with py-spy sampling the stacks meanwhile."""

    name = "trace"
    path_key = "trace"

    def message(self, settings: CaptureSettings) -> dict[str, Any]:
        return settings.message()

    def begin(self, pid: int, settings: CaptureSettings) -> Any:
        if not settings.sample_stacks:
            return None
        from gputop.stacks.timeline import TimelineRecorder

        recorder = TimelineRecorder(pid, max_seconds=settings.timeout + SAMPLING_MARGIN_S)
        recorder.start()  # from the request on: a fast job records its steps in milliseconds
        return recorder

    def progress(self, side: Any, status: dict[str, Any]) -> None:
        return None

    def abort(self, side: Any) -> None:
        if side is not None:
            side.stop()

    def result(self, pid: int, settings: CaptureSettings, reply: dict[str, Any],
               side: Any) -> CaptureResult:
        timeline = side.stop() if side is not None else None
        result = CaptureResult(pid, reply, reply["trace"])
        result.notes.extend(_reply_lines(reply, "notes"))
        note = partial_note(reply)
        if note:
            result.notes.append(note)
        _analyse(result, reply)
        if side is not None:
            _join(result, reply, timeline, side)
        return result


TRACE = TraceCapture()


@dataclass
class MemoryResult:
    pid: int
    reply: dict[str, Any]
    path: str  # the report file the agent wrote
    report: MemoryReport
    notes: list[str] = field(default_factory=list)
    replied_wall: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        from gputop.capture.memory.render import report_json

        data = report_json(self.report, self.path)
        data["capture"] = {key: self.reply.get(key) for key in (
            "steps", "recorded_steps", "first_recorded_step", "bytes", "blocked_s",
            "started_wall", "window_end_wall")}
        data["capture"]["replied_wall"] = round(self.replied_wall, 6)
        return data


class MemoryCaptureKind:
    """The allocations of a few steps (``agent.memory``): the agent writes a memory report
    and names it; it is read here as untrusted input (``memory.report``)."""

    name = "memory"
    path_key = "report"

    def message(self, settings: CaptureSettings) -> dict[str, Any]:
        message: dict[str, Any] = {"cmd": "memory", "timeout": settings.timeout,
                                   "steps": DEFAULT_STEPS if settings.steps is None
                                   else settings.steps}
        out = settings.out_dir()
        if out:
            message["out"] = out
        return message

    def begin(self, pid: int, settings: CaptureSettings) -> Any:
        return None

    def progress(self, side: Any, status: dict[str, Any]) -> None:
        return None

    def abort(self, side: Any) -> None:
        return None

    def result(self, pid: int, settings: CaptureSettings, reply: dict[str, Any],
               side: Any) -> MemoryResult:
        from gputop.capture.memory.report import ReportError, read_report

        path = reply["report"]
        uid = reply.get("agent_uid")
        owner = uid if isinstance(uid, int) and uid != os.geteuid() else None
        try:
            report = read_report(path, owner_uid=owner)
        except ReportError as exc:
            raise CaptureFailed(str(exc), "bad-report") from None
        if report.pid != pid and owner is None and not path.startswith("/proc/"):
            raise CaptureFailed(f"{path}: the report is of pid {report.pid}, not {pid}",
                                "bad-report")
        return MemoryResult(pid, reply, path, report, _reply_lines(reply, "notes"))


MEMORY = MemoryCaptureKind()


def _reply_lines(reply: dict[str, Any], key: str) -> list[str]:
    """An agent's list of lines, bounded and escaped (an agent is untrusted)."""
    from gputop.core.format import safe_text

    lines = reply.get(key)
    if not isinstance(lines, list):
        return []
    return [safe_text(" ".join(x.split()))[:400] for x in lines[:16] if isinstance(x, str)]


def _analyse(result: CaptureResult, reply: dict[str, Any]) -> None:
    from gputop.diagnostics.trace.analysis import TraceError, analyze_trace

    limits = trace_limits(reply)
    try:
        analysis = analyze_trace(result.trace, limits, pid=result.pid,
                                 cmdline=process_cmdline(result.pid))
    except TraceError as exc:
        result.error = str(exc)
        if reply.get("mode") == "seconds" and result.notes and "no profiler events" in str(exc):
            # The window that stood in for steps saw no torch work: say that, not "not a trace".
            seconds = reply.get("seconds")
            result.error = (f"{result.notes[0].split(':', 1)[0]}, and no torch operator ran in "
                            f"the {seconds:g} s time window recorded instead: the process is "
                            "idle or busy outside torch (see where: gputop stacks "
                            f"{result.pid})")
        return
    for line in _reply_lines(reply, "cut"):
        if line not in analysis.cut:
            analysis.cut.append(line)
    result.analysis = analysis
    if reply.get("with_stack") is True:  # the profiler's Python frames: their own section
        from gputop.diagnostics.stack_lines import top_source_lines

        result.stack_lines = top_source_lines(result.trace, limits)


def _join(result: CaptureResult, reply: dict[str, Any], timeline: Timeline | None,
          recorder: TimelineRecorder) -> None:
    if timeline is None:
        why = recorder.error or "py-spy sampled nothing"
        result.notes.append(f"no Python stacks from py-spy: {why}")
        return
    result.notes.extend(timeline.notes)
    if result.analysis is None:
        return
    from gputop.stacks.trace_join import join, with_where

    walls = [w for w in reply.get("walls") or [] if isinstance(w, (int, float))]
    thread = reply.get("train_thread")
    result.stacks_rate = timeline.rate
    result.wheres = join(result.analysis, timeline, walls, result.pid,
                         thread if isinstance(thread, int) else None)
    result.analysis.findings = with_where(result.analysis.findings, result.wheres)


# --- whole jobs -------------------------------------------------------------------------------


@dataclass
class JobCaptureResult:
    capture: JobCapture  # every rank's reply or error
    analyses: list[tuple[TraceAnalysis, RankCapture]]  # each analysed rank
    cross: CrossRank | None  # the ranks compared
    problems: list[str]  # one line each: what the analysis of the ranks could not do

    @property
    def failed(self) -> list[str]:
        """One line per rank that gave no trace."""
        from gputop.core.format import safe_text

        return [f"rank {f.agent.rank} (pid {f.agent.pid}) has no trace: {safe_text(f.error)}"
                for f in self.capture.failed]


def capture_job(pid: int, settings: CaptureSettings = CaptureSettings(), *,
                on_progress: Callable[[str], None] | None = None,
                should_stop: ShouldStop | None = None,
                on_job: Callable[[Any], None] | None = None) -> JobCaptureResult:
    """Record the same steps on every rank of ``pid``'s job (``agent.jobs``), analyse each
    rank's trace and compare the ranks. ``CaptureFailed`` when the job cannot be found or
    the capture directory made; one rank's failure is a problem line, not a failure."""
    namespaces.wire()  # ranks in containers too
    from gputop.client.jobs import capture_job as capture_ranks
    from gputop.client.jobs import find_job
    from gputop.core.format import safe_text
    from gputop.diagnostics.trace.analysis import compare_job

    if settings.seconds is not None:
        raise CaptureFailed("--job records steps: give --steps, not --seconds", "usage")
    try:
        job = find_job(pid)
    except AgentError as exc:
        raise CaptureFailed(safe_text(str(exc)), exc.code) from None
    if on_job is not None:
        on_job(job)
    try:
        result = capture_ranks(job, DEFAULT_STEPS if settings.steps is None else settings.steps,
                               settings.timeout, warmup=settings.warmup, out=settings.out,
                               with_stack=settings.with_stack, on_progress=on_progress,
                               should_stop=should_stop)
    except OSError as exc:
        raise CaptureFailed(f"cannot create the capture directory: {exc.strerror or exc}",
                            "capture-dir") from None
    if on_progress is not None:
        on_progress("analyzing the ranks' traces")
    analyses, problems = analyse_ranks(result)
    crosses = compare_job([a for a, _ in analyses])
    return JobCaptureResult(result, analyses, crosses[0] if crosses else None,
                            [safe_text(p) for p in problems])


def analyse_ranks(result: JobCapture) -> tuple[list[tuple[TraceAnalysis, RankCapture]],
                                              list[str]]:
    """Each captured rank's analysis, with its pid and command line for the next steps."""
    from gputop.diagnostics.trace.analysis import TraceError, analyze_trace

    out: list[tuple[TraceAnalysis, RankCapture]] = []
    problems: list[str] = []
    for rc in result.captured:
        reply = rc.reply
        if reply is None:  # a captured rank has its reply
            continue
        note = partial_note(reply)
        if note:
            problems.append(f"rank {rc.agent.rank}: {note}")
        try:
            a = analyze_trace(reply["trace"], trace_limits(reply), pid=rc.agent.pid,
                              cmdline=process_cmdline(rc.agent.pid))
        except TraceError as exc:
            problems.append(f"rank {rc.agent.rank}: cannot analyze its trace: {exc}")
            continue
        for line in _reply_lines(reply, "cut"):
            if line not in a.cut:
                a.cut.append(line)
        out.append((a, rc))
    if not result.aligned() and len(result.captured) > 1:
        problems.append("the ranks did not all record from the same step; the comparison "
                        "aligns what they share")
    return out, problems
