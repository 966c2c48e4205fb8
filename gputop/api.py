"""gputop as a library: sample the GPUs, analyse a trace or a dump folder, read a recording, run
the live rules over snapshots.

    from gputop.api import analyze, sample, read_recording, diagnose

    result = analyze("trace.pt.trace.json.gz")     # or a tensorboard folder, or FR dumps
    print(result.verdict)
    for finding in result.findings:
        print(finding.id, finding.title)

    snap = sample()                                 # one Snapshot of this host's GPUs
    snap = sample(demo="tour")                      # ... or of a simulated scenario
    findings = diagnose(read_recording("run.gputop").snapshots())

Everything here is typed (``py.typed``) and every failure on bad input is raised as
``gputop.api.Error`` with a one-line message. The names in ``__all__`` are the public face; the
modules behind them may move.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gputop.core.agent_status import AgentStatus
from gputop.core.errors import UsageError
from gputop.core.model import GpuSample, HostSample, ProcSample, Snapshot
from gputop.diagnostics.findings import Finding

if TYPE_CHECKING:
    from gputop.diagnostics.hang.attribution import HangReport
    from gputop.diagnostics.trace.analysis import TraceAnalysis

__all__ = [
    "AgentStatus", "Analysis", "Error", "Finding", "GpuSample", "HostSample", "ProcSample",
    "Recorded", "Snapshot", "analyze", "diagnose", "read_recording", "sample",
]


class Error(Exception):
    """Bad input or no GPU to read: the message is one line, fit to print."""


@dataclass(frozen=True)
class Analysis:
    """What ``analyze`` found: a verdict in one line, the findings (cause, evidence, fix) and
    the analysis behind them: ``traces`` (one ``TraceAnalysis`` per trace file) or ``hang``
    (the ``HangReport`` of Flight Recorder dumps)."""

    verdict: str
    findings: tuple[Finding, ...]
    traces: tuple[TraceAnalysis, ...] = ()
    hang: HangReport | None = None

    def to_json(self) -> dict:
        """What ``gputop analyze --json`` prints for the same input."""
        if self.hang is not None:
            return self.hang.to_json()
        if len(self.traces) == 1:
            return self.traces[0].to_json()
        return {"verdict": self.verdict, "traces": [t.to_json() for t in self.traces]}


def analyze(path: str | os.PathLike[str]) -> Analysis:
    """Analyse a ``torch.profiler`` trace, a folder of traces (``tensorboard_trace_handler``),
    or a folder of Flight Recorder dumps (a hang), as ``gputop analyze PATH`` does."""
    from gputop.diagnostics.hang.folder import dump_files, is_dump_file
    from gputop.diagnostics.trace.analysis import analyze_trace, compare_ranks
    from gputop.diagnostics.trace.loading.folder import traces_in
    from gputop.diagnostics.trace.loading.load import TraceError

    where = os.fspath(path)
    if not os.path.exists(where):
        raise Error(f"{where}: no such file or folder")
    if os.path.isdir(where):
        dumps = dump_files(where)
        if dumps:
            return _hang(dumps)
        try:
            files = traces_in(where)
        except UsageError as exc:
            raise Error(str(exc)) from None
        if not files:
            raise Error(f"{where}: no trace and no Flight Recorder dump in this folder")
    elif is_dump_file(where):
        return _hang([where])
    else:
        files = [where]
    try:
        traces = tuple(analyze_trace(f) for f in files)
    except TraceError as exc:
        raise Error(str(exc)) from None
    findings = [f for t in traces for f in t.findings]
    findings += compare_ranks(traces) if len(traces) > 1 else []
    verdict = traces[0].verdict if len(traces) == 1 else _job_verdict(traces, findings)
    return Analysis(verdict=verdict, findings=tuple(findings), traces=traces)


def _job_verdict(traces: Iterable[TraceAnalysis], findings: list[Finding]) -> str:
    worst = findings[0].id if findings else "healthy"
    return f"{worst} ({sum(1 for _ in traces)} traces)"


def _hang(files: list[str]) -> Analysis:
    from gputop.diagnostics.hang.attribution import attribute
    from gputop.diagnostics.hang.folder import load_dumps

    loaded = load_dumps(files)
    if not loaded.dumps:
        raise Error(loaded.errors[0] if loaded.errors else "no readable Flight Recorder dump")
    report = attribute(loaded.dumps)
    return Analysis(verdict=report.verdict, findings=tuple(report.findings), hang=report)


def sample(demo: str | None = None, agents: bool = True) -> Snapshot:
    """One sample of this host: its GPUs (NVML), the host, and the GPU processes with what
    their agents say. ``demo``: a simulated scenario's GPUs instead (``gputop --demo list``),
    with its stand-in processes, which end when this returns."""
    from gputop.client.session import open_sampler

    if demo is not None:
        from gputop.sim.scenarios import SCENARIOS

        if demo not in SCENARIOS:
            raise Error(f"no demo scenario {demo!r} (one of: {', '.join(sorted(SCENARIOS))})")
    # Without a driver the snapshot says so (``driver``) and holds no GPU: nothing raises.
    with open_sampler(demo=demo, agents=agents, trainer=False) as sampler:
        return sampler.sample()


@dataclass
class Recorded:
    """A ``gputop record`` folder opened for reading: its header and its snapshots."""

    path: Path
    host: str
    interval_s: float
    count: int
    problems: list[str] = field(default_factory=list)  # parts and samples that were skipped
    _replay: object = field(default=None, repr=False)

    def snapshots(self) -> Iterator[Snapshot]:
        """Every snapshot in time order (damaged ones skipped and named in ``problems``)."""
        from gputop.recording.replay import Replay

        assert isinstance(self._replay, Replay)
        yield from self._replay.snapshots()
        self.problems[:] = self._replay.problems


def read_recording(path: str | os.PathLike[str]) -> Recorded:
    """Open a recording written by ``gputop record``."""
    from gputop.recording.replay import open_replay
    from gputop.recording.store import RecordingError

    try:
        replay = open_replay(Path(path))
    except RecordingError as exc:
        raise Error(str(exc)) from None
    return Recorded(path=replay.path, host=replay.host, interval_s=replay.interval,
                    count=replay.count, problems=list(replay.problems), _replay=replay)


def diagnose(snapshots: Iterable[Snapshot]) -> list[Finding]:
    """Run the live rules over snapshots in time order, as the monitor does while it runs;
    the findings standing after the last one, worst first."""
    from gputop.diagnostics.live.hysteresis import LiveDiagnosis

    live = LiveDiagnosis()
    for snap in snapshots:
        live.update(snap)
    return live.findings()
