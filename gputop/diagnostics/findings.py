"""Findings: a named cause, its evidence in numbers, the fix, and where to look next.

Shared by the trace rules (``diagnostics.trace_rules``) and the live rules (``diagnostics.live``):
both emit ``Finding`` objects with the stable ids of ``CATALOGUE``. Pure Python, no imports of
textual, pynvml or torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SEVERITIES = ("info", "warning", "critical")

# Share of the judged time a finding costs -> severity, for the trace rules and the live ones.
# 5%: TensorBoard's profiler plugin recommends acting on the DataLoader from 5% of the step time;
# below that a cost is within step-to-step noise and not worth a warning.
# The live findings a "where" line answers (gputop.stacks.where): CPU work in the training
# process or its workers, or the place a hung process waits. Here, so that the monitor knows
# them before it loads the stacks modules (at the first such finding).
WHERE_IDS = frozenset({"dataloader-stall", "host-bound", "host-sync", "hung", "cpu-contention"})
WARNING_SHARE = 0.05
# 25%: a quarter of the step; fixing this alone makes the step at least 1.33x faster.
CRITICAL_SHARE = 0.25


def severity_for(share: float) -> str:
    """The severity of a finding that costs ``share`` of the judged time."""
    if share >= CRITICAL_SHARE:
        return "critical"
    return "warning" if share >= WARNING_SHARE else "info"
SEVERITY_RANK: dict[str, int] = {name: rank for rank, name in enumerate(SEVERITIES)}

# Stable ids (DESIGN.md) -> one-line meaning. The order is the order of DESIGN.md.
CATALOGUE: dict[str, str] = {
    "dataloader-stall": "the input pipeline starves the GPU",
    "host-sync": "the GPU runs dry because the CPU blocked on it (.item(), .cpu(), synchronize)",
    "pageable-memcpy": "host-device copies from pageable memory, or blocking copies",
    "launch-bound": "the GPU waits on the host's launch path (operator dispatch, kernel launches)",
    "communication": "collectives take a large share of the step and are not overlapped",
    "allocator-churn": "cudaMalloc/cudaFree in steady state",
    "long-gpu-gaps": "the GPU sits idle for long stretches (checkpoint, eval, logging)",
    "no-tensor-cores": "matrix work in fp32 on a GPU with tensor cores",
    "memory-pressure": "GPU memory near capacity",
    "memory-growth": "memory rising steadily over time (a leak)",
    "throttling": "clocks held down by power or thermal limits",
    "pcie-bound": "host-to-device traffic high while the GPU waits",
    "gpu-idle": "the GPU idles while the host does other work or waits (Python, I/O, a hang)",
    "hung": "no GPU work and no step progress for a long time",
    "contention": "several processes share one GPU",
    "imbalance": "GPUs of one job do unequal work (a straggler)",
    "hardware-errors": "XID / ECC / remapped-row events",
    "cold-start": "the trace is start-up (context, first allocations, autotune, compile)",
    # Beyond DESIGN.md's table (docs/ARCHITECTURE.md, departures): a trace-only cause, and
    # live ones.
    "copy-bound": "host-device copies bound the step (the link, not compute, sets its pace)",
    "host-bound": "the GPU idles while the training thread runs its own code (Python, "
                  "bookkeeping) outside the DataLoader",
    "mfu-drop": "MFU far below the job's own best window",
    # The roofline: in traces per op, live from GPM's DRAM, tensor and SM activity.
    "memory-bound-ops": "memory-bound ops (element-wise, norm, softmax) far from the "
                        "bandwidth roof",
    "gemm-under-roof": "matrix work (GEMM, convolution, attention) far under its roofline",
    "memory-bound": "a busy GPU whose DRAM is busy and tensor pipes idle (memory-bound work)",
    "latency-bound": "a busy GPU whose SMs are mostly idle (latency-bound: small kernels, "
                     "syncs)",
    "cpu-contention": "the job's threads wait for a CPU (other processes, or its cgroup's CPU "
                      "quota): the host's load, not the job, sets the pace",
    # Hangs across ranks: live from the agents' step times, offline from Flight
    # Recorder dumps (gputop/diagnostics/hang/).
    "hang": "ranks wait in a collective that other ranks never reached",
    "rank-exited": "a rank's process is gone while the others wait for it",
    "desync": "ranks called different collectives, or different sizes, at the same sequence "
              "number",
    "stuck-collective": "a collective every rank entered never completed (a GPU that stopped, "
                        "a kernel that never ends)",
    # torch.compile's health (issue 41), from the agent.
    "recompiles": "a compiled function recompiles while the job runs (its inputs change)",
    "graph-breaks": "compiled code returns to Python at graph breaks on every call",
    "compile-fallback": "a compiled function hit the recompile limit and now runs eager",
    "compile-stall": "steps blocked on torch.compile after warm-up",
    "cudagraph-rerecord": "CUDA graphs re-recorded while the job runs",
}


@dataclass(frozen=True)
class Finding:
    """One diagnosed cause. ``cost_s`` is the time it costs over the observed window (seconds);
    findings are shown most costly first."""

    id: str
    severity: str
    title: str
    evidence: str
    fix: str
    next_step: str
    cost_s: float = 0.0
    gpu: int | None = None
    pid: int | None = None
    # Where in the code (live findings, from the process's Python stacks): "decode_sample
    # (dataset.py:48), 61 % of worker samples". Set after the rules ran; None until known.
    where: str | None = None
    # The distributed job and rank it concerns (live findings on a rank's process or GPU).
    job: str | None = None
    rank: int | None = None
    # MIG: the GPU instance of ``gpu`` it is about (a live rule judged that MIG device).
    gpu_instance: int | None = None

    def __post_init__(self) -> None:
        # Catch typos at the source: a misspelt id or severity would silently break the UI.
        if self.id not in CATALOGUE:
            raise ValueError(f"unknown finding id {self.id!r}")
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_json(self) -> dict:
        out: dict = {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
            "next_step": self.next_step,
            "cost_s": round(self.cost_s, 6),
        }
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.pid is not None:
            out["pid"] = self.pid
        if self.where is not None:
            out["where"] = self.where
        if self.job is not None:
            out["job"] = self.job
            out["rank"] = self.rank
        if self.gpu_instance is not None:
            out["gpu_instance"] = self.gpu_instance
        return out


def finding_key(f: Finding) -> tuple:
    """What names one finding across ticks: its id and what it is about."""
    if f.gpu_instance is not None:  # a MIG device (a key of four only then)
        return (f.id, f.gpu, f.pid, f.gpu_instance)
    return (f.id, f.gpu, f.pid)


def order_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most costly first; at equal cost the more severe first, then by id for a stable order."""
    return sorted(findings, key=lambda f: (-f.cost_s, -SEVERITY_RANK[f.severity], f.id))


def actionable(findings: Iterable[Finding]) -> list[Finding]:
    """Findings of severity warning or worse, in the given order."""
    return [f for f in findings if SEVERITY_RANK[f.severity] >= SEVERITY_RANK["warning"]]


# The verdict of a trace whose GPU activity was not recorded and whose host shows no problem:
# nothing may be said about the device, healthy included.
NOT_ASSESSED = "not-assessed"


def verdict(findings: Iterable[Finding]) -> str:
    """The id of the costliest finding of severity warning or worse, else ``healthy``.

    Cost decides, not severity: a warning that costs more time than a critical finding is the
    first thing to fix. Ties follow ``order_findings``.
    """
    top = actionable(order_findings(findings))
    return top[0].id if top else "healthy"


def healthy_reason(findings: Iterable[Finding], summary: str) -> str | None:
    """Why the verdict is healthy (``None`` when it is not): ``summary`` says what was measured,
    e.g. "GPU busy 97% of the steps", and minor (info) findings are named so nothing is hidden."""
    findings = list(findings)
    if actionable(findings):
        return None
    minor = [f.id for f in order_findings(findings)]
    tail = f"; minor only: {', '.join(minor)}" if minor else ""
    return f"{summary}{tail}"
