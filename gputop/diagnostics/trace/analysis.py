"""Analysis of torch.profiler / Kineto Chrome traces: load, measure, diagnose.

``analyze_trace(path)`` is the entry point used by ``gputop analyze`` and ``gputop capture``;
``compare_ranks(analyses)`` compares several ranks of one job. Loading lives in
``loading/load.py``, metrics in ``trace_metrics``, rules in ``causes/rules.py``. Pure Python: no
textual, pynvml or torch.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gputop.diagnostics.findings import (
    NOT_ASSESSED,
    Finding,
    healthy_reason,
    order_findings,
    verdict,
)
from gputop.diagnostics.next_steps import app_of
from gputop.diagnostics.trace.causes.roofline import roofline_findings
from gputop.diagnostics.trace.causes.rules import healthy_summary, run_rules
from gputop.diagnostics.trace.loading.load import DEFAULT_LIMITS, LoadLimits, TraceError, load_trace
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics, compute_metrics
from gputop.diagnostics.trace.measuring.roofline import Roofline, build_roofline
from gputop.diagnostics.trace.ranks import CrossRank, compare, split_communication

__all__ = ["TraceAnalysis", "TraceError", "analyze_trace", "attach_findings", "compare_job",
           "compare_ranks"]


@dataclass
class TraceAnalysis:
    file: str
    metrics: dict
    findings: list[Finding]
    verdict: str
    healthy_reason: str | None
    assessed: list[str] = field(default_factory=list)
    not_assessed: list[str] = field(default_factory=list)
    rank: int | None = None
    # What the trace lost to a size or memory budget, one line each (the agent's cut before it
    # wrote the trace, the loader's over --max-events): the analysis is of what was kept.
    cut: list[str] = field(default_factory=list)
    # The measured data behind ``metrics`` (interval sets, per-step roles); not serialised.
    details: TraceMetrics | None = field(default=None, repr=False, compare=False)
    # Set when analysed with the other ranks of its job (``compare_job``).
    cross_rank: CrossRank | None = field(default=None, repr=False, compare=False)
    # Per op and class: FLOPs, bytes, time and the fraction of the GPU's roof (``roofline``).
    roofline: Roofline | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "metrics": self.metrics,
            "findings": [f.to_json() for f in self.findings],
            "verdict": self.verdict,
            "healthy_reason": self.healthy_reason,
            "assessed": list(self.assessed),
            "not_assessed": list(self.not_assessed),
            "cut": list(self.cut),
            **({"cross_rank": self.cross_rank.to_json()} if self.cross_rank is not None else {}),
            "roofline": self.roofline.to_json() if self.roofline is not None else None,
        }


@contextmanager
def _gc_paused():
    # Loading and measuring allocate hundreds of thousands of small objects and create no
    # reference cycles; the cyclic collector would only rescan them again and again.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def analyze_trace(
    path: str | os.PathLike,
    limits: LoadLimits = DEFAULT_LIMITS,
    pid: int | None = None,
    cmdline: Sequence[str] | None = None,
) -> TraceAnalysis:
    """Load and diagnose one trace. Every failure, bad input or a shape the rules did not
    foresee, is raised as ``TraceError`` with a one-line message: a trace is untrusted input.

    ``pid`` and ``cmdline``: the process the trace was captured from, when known (``gputop
    capture``, ``p``), so the next steps name the real command instead of a placeholder."""
    try:
        with _gc_paused():
            data = load_trace(path, limits)
            tm = compute_metrics(data)
            roof = build_roofline(data) if tm.gpu_present else None
            cut = list(data.cut)
            del data  # events are no longer needed; the metrics keep what the rules read
            if pid is not None:
                tm.details["pid"] = pid
            if cmdline:
                tm.details["app"] = app_of(cmdline)
            findings = [*run_rules(tm), *roofline_findings(tm, roof)]
        analysis = _analysis(os.fspath(path), tm, findings, cut)
        analysis.roofline = roof
        return analysis
    except TraceError:
        raise
    except MemoryError:
        raise TraceError(f"{os.fspath(path)}: not enough memory to analyse it") from None
    except RecursionError:
        raise TraceError(f"{os.fspath(path)}: nested too deeply to analyse") from None
    except Exception as exc:  # a shape nobody foresaw: one line, never a traceback
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise TraceError(f"{os.fspath(path)}: cannot analyse ({text}); please report this "
                         "trace") from None


def _analysis(path: str, tm: TraceMetrics, findings: list[Finding],
              cut: list[str] | None = None) -> TraceAnalysis:
    findings = order_findings(findings)
    judged = verdict(findings)
    if judged == "healthy" and tm.gpu_unrecorded:
        judged = NOT_ASSESSED  # no device was measured: healthy would be a device verdict
    return TraceAnalysis(
        file=path,
        metrics=tm.to_json(),
        findings=findings,
        verdict=judged,
        healthy_reason=(healthy_reason(findings, healthy_summary(tm))
                        if judged == "healthy" else None),
        assessed=list(tm.assessed),
        not_assessed=list(tm.not_assessed),
        rank=tm.rank,
        cut=list(cut or []),
        details=tm,
    )


def _labels(analyses: Sequence[TraceAnalysis]) -> list[str]:
    ranks = [a.rank for a in analyses]
    if all(r is not None for r in ranks) and len(set(ranks)) == len(ranks):
        return [f"rank {r}" for r in ranks]
    return [os.path.basename(a.file) for a in analyses]


def jobs_among(analyses: Sequence[TraceAnalysis]) -> list[list[TraceAnalysis]]:
    """The groups of analyses that are ranks of one job: each declares its rank
    (``distributedInfo``, written by torch.distributed), the ranks of a group share one world
    size and differ. Traces of no job (no rank) are left alone."""
    groups: dict[int | None, list[TraceAnalysis]] = {}
    for a in analyses:
        if a.details is not None and a.details.rank is not None:
            groups.setdefault(a.details.world_size, []).append(a)
    jobs = []
    for group in groups.values():
        ranks = [a.details.rank for a in group]
        if len(group) >= 2 and len(set(ranks)) == len(ranks):
            jobs.append(sorted(group, key=lambda a: a.details.rank))
    return jobs


def compare_job(analyses: Sequence[TraceAnalysis]) -> list[CrossRank]:
    """Cross-rank analysis of every job among ``analyses`` (``diagnostics/trace/ranks.py``): per rank the wait
    inside collectives, the straggler and its own cause. The ``imbalance`` finding is attached
    to the straggler's analysis and every rank's ``communication`` finding gets its exposed
    time split into waiting for the late rank and bandwidth."""
    out = []
    for ranks in jobs_among(analyses):
        cross = compare([a.details for a in ranks], _labels(ranks), [a.file for a in ranks],
                        [a.findings for a in ranks])
        for a, row in zip(ranks, cross.rows):
            a.findings = [split_communication(f, row, cross.straggler)
                          if f.id == "communication" else f for f in a.findings]
            a.cross_rank = cross
        if cross.straggler is not None and cross.findings:
            attach_findings(ranks[cross.rows.index(cross.straggler)], cross.findings)
        out.append(cross)
    return out


def compare_ranks(analyses: Sequence[TraceAnalysis]) -> list[Finding]:
    """The cross-rank findings of the jobs among ``analyses`` (see ``compare_job``), without
    attaching them."""
    return [f for ranks in jobs_among(analyses)
            for f in compare([a.details for a in ranks], _labels(ranks),
                             [a.file for a in ranks], [a.findings for a in ranks]).findings]


def attach_findings(analysis: TraceAnalysis, extra: Sequence[Finding]) -> None:
    """Add findings (e.g. from ``compare_ranks``) and recompute order and verdict."""
    if not extra:
        return
    analysis.findings = order_findings([*analysis.findings, *extra])
    analysis.verdict = verdict(analysis.findings)
    if analysis.verdict == "healthy" and analysis.details and analysis.details.gpu_unrecorded:
        analysis.verdict = NOT_ASSESSED
    summary = healthy_summary(analysis.details) if analysis.details else "analysed"
    analysis.healthy_reason = healthy_reason(analysis.findings, summary)
