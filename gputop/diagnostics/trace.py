"""Analysis of torch.profiler / Kineto Chrome traces: load, measure, diagnose.

``analyze_trace(path)`` is the entry point used by ``gputop analyze`` and ``gputop capture``;
``compare_ranks(analyses)`` compares several ranks of one job. Loading lives in
``trace_load``, metrics in ``trace_metrics``, rules in ``trace_rules``. Pure Python: no
textual, pynvml or torch.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gputop.diagnostics.findings import Finding, healthy_reason, order_findings, verdict
from gputop.diagnostics.next_steps import app_of
from gputop.diagnostics.trace_load import DEFAULT_LIMITS, LoadLimits, TraceError, load_trace
from gputop.diagnostics.trace_metrics import TraceMetrics, compute_metrics
from gputop.diagnostics.trace_rules import healthy_summary, rank_imbalance, run_rules

__all__ = ["TraceAnalysis", "TraceError", "analyze_trace", "attach_findings", "compare_ranks"]


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
    # The measured data behind ``metrics`` (interval sets, per-step roles); not serialised.
    details: TraceMetrics | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "metrics": self.metrics,
            "findings": [f.to_json() for f in self.findings],
            "verdict": self.verdict,
            "healthy_reason": self.healthy_reason,
            "assessed": list(self.assessed),
            "not_assessed": list(self.not_assessed),
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
            del data  # events are no longer needed; the metrics keep what the rules read
            if pid is not None:
                tm.details["pid"] = pid
            if cmdline:
                tm.details["app"] = app_of(cmdline)
            findings = run_rules(tm)
        return _analysis(os.fspath(path), tm, findings)
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


def _analysis(path: str, tm: TraceMetrics, findings: list[Finding]) -> TraceAnalysis:
    findings = order_findings(findings)
    return TraceAnalysis(
        file=path,
        metrics=tm.to_json(),
        findings=findings,
        verdict=verdict(findings),
        healthy_reason=healthy_reason(findings, healthy_summary(tm)),
        assessed=list(tm.assessed),
        not_assessed=list(tm.not_assessed),
        rank=tm.rank,
        details=tm,
    )


def _labels(analyses: Sequence[TraceAnalysis]) -> list[str]:
    ranks = [a.rank for a in analyses]
    if all(r is not None for r in ranks) and len(set(ranks)) == len(ranks):
        return [f"rank {r}" for r in ranks]
    return [os.path.basename(a.file) for a in analyses]


def compare_ranks(analyses: Sequence[TraceAnalysis]) -> list[Finding]:
    """``imbalance`` findings over several traces of one job (one trace per rank).

    Only traces that say they are ranks of one job are compared: each declares its rank
    (``distributedInfo``, written by torch.distributed), the ranks differ and the world sizes
    agree. Unrelated traces analysed together are left alone."""
    usable = [a for a in analyses if a.details is not None]
    if len(usable) < 2:
        return []
    ranks = [a.details.rank for a in usable]
    sizes = {a.details.world_size for a in usable}
    if None in ranks or len(set(ranks)) != len(ranks) or len(sizes) != 1:
        return []
    for a in usable:
        a.details.details["rank_files"] = [a2.file for a2 in usable]
    return rank_imbalance([a.details for a in usable], _labels(usable))


def straggler_of(analyses: Sequence[TraceAnalysis], finding: Finding) -> TraceAnalysis | None:
    """The analysis an ``imbalance`` finding is about (named in its title)."""
    usable = [a for a in analyses if a.details is not None]
    for label, a in zip(_labels(usable), usable):
        if finding.title.startswith(f"{label} "):
            return a
    return None


def attach_findings(analysis: TraceAnalysis, extra: Sequence[Finding]) -> None:
    """Add findings (e.g. from ``compare_ranks``) and recompute order and verdict."""
    if not extra:
        return
    analysis.findings = order_findings([*analysis.findings, *extra])
    analysis.verdict = verdict(analysis.findings)
    summary = healthy_summary(analysis.details) if analysis.details else "analysed"
    analysis.healthy_reason = healthy_reason(analysis.findings, summary)
