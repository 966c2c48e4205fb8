"""Nodes and jobs across the fleet, from one refresh's answers and the nodes' diagnoses. Pure.

A GPU's job: its Slurm job (``hpc_job``), else its pod's owner (the pod name without the
ordinal of a StatefulSet or a training operator's ``-worker-N``, or the random suffix of a
Job's pod), else, for a node whose GPUs carry the agent's job series, the node's training job;
else a GPU holding memory is "unlabelled work" on its node. Jobs are sorted for an operator:
the most wasted GPU-hours first (each GPU's idle share over the last hour x the time it was
seen), then the cost of their findings.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from gputop.diagnostics.findings import CATALOGUE, SEVERITY_RANK
from gputop.fleet.prometheus.sources import WASTE_WINDOW_S, FleetData, GpuRef

STRAGGLER_STEP = 0.15  # a rank this much slower than the job's median step is named
STRAGGLER_UTIL = 20.0  # a GPU this many points under the job's median utilization is named
_POD_OWNER = (re.compile(r"-(master|worker|launcher|chief|ps)-\d+$"), re.compile(r"-\d+$"),
              re.compile(r"-[a-z0-9]{5}$"))


@dataclass(frozen=True, slots=True)
class NodeFinding:
    """A finding of one node (its host leads), from gputop's exporter or the live rules."""

    host: str
    instance: str
    source: str
    id: str
    severity: str
    title: str
    evidence: str
    fix: str
    next_step: str
    cost_s: float = 0.0
    gpu: int | None = None
    job: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "instance": self.instance, "source": self.source,
                "gpu": self.gpu, "pid": None, "id": self.id, "severity": self.severity,
                "title": self.title, "evidence": self.evidence, "fix": self.fix,
                "next_step": self.next_step, "cost_s": self.cost_s, "job": self.job}


@dataclass(slots=True)
class GpuView:
    ref: GpuRef
    util: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    power_w: float | None = None
    sm_active: float | None = None
    util_hour: float | None = None
    seen_s: float = 0.0
    job: str | None = None
    rank: str | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    goodput: float | None = None
    j_per_step: float | None = None

    @property
    def wasted_gpu_h(self) -> float:
        if self.util_hour is None:
            return 0.0
        return max(0.0, 1.0 - self.util_hour / 100.0) * self.seen_s / 3600.0


@dataclass(slots=True)
class NodeView:
    instance: str
    host: str
    source: str
    gpus: list[GpuView] = field(default_factory=list)
    findings: list[NodeFinding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class JobView:
    key: str
    kind: str  # slurm | pod | agent | node
    nodes: list[str] = field(default_factory=list)
    gpus: list[GpuView] = field(default_factory=list)
    findings: list[NodeFinding] = field(default_factory=list)
    util_mean: float | None = None
    util_worst: float | None = None
    wasted_gpu_h: float = 0.0
    step_time_s: float | None = None
    step_spread: float | None = None
    mfu: float | None = None
    goodput: float | None = None
    j_per_step: float | None = None
    straggler: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def cost(self) -> float:
        return sum(f.cost_s + 10.0 ** SEVERITY_RANK.get(f.severity, 0) for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 3) -> float | None:
            return None if x is None else round(x, n)

        return {"kind": "job", "job": self.key, "job_kind": self.kind, "nodes": self.nodes,
                "gpus": len(self.gpus), "util_mean": r(self.util_mean, 1),
                "util_worst": r(self.util_worst, 1), "wasted_gpu_hours": r(self.wasted_gpu_h),
                "step_time_s": r(self.step_time_s, 4), "step_spread": r(self.step_spread),
                "mfu": r(self.mfu), "goodput": r(self.goodput), "j_per_step": r(self.j_per_step),
                "straggler": self.straggler, "labels": self.labels,
                "findings": [f"{f.host}: {f.id}" + (f" GPU {f.gpu}" if f.gpu is not None else "")
                             for f in self.findings]}


def pod_owner(pod: str) -> str:
    for pattern in _POD_OWNER:
        stripped = pattern.sub("", pod)
        if stripped != pod and stripped:
            return stripped
    return pod


def job_of(ref: GpuRef, has_agent: bool, held: bool) -> tuple[str, str] | None:
    labels = ref.labels
    if labels.get("hpc_job"):
        return f"slurm:{labels['hpc_job']}", "slurm"
    if labels.get("pod"):
        ns = labels.get("namespace", "")
        return f"pod:{ns + '/' if ns else ''}{pod_owner(labels['pod'])}", "pod"
    name = ref.host or ref.instance
    if has_agent:
        return f"agent:{name}", "agent"
    if held:
        return f"node:{name}", "node"
    return None


def exporter_finding(host: str, instance: str, item: dict) -> NodeFinding:
    """A ``gputop_finding_active`` series as a finding: the node's gputop judged it."""
    fid = item["id"] or "?"
    severity = item["severity"] if item["severity"] in SEVERITY_RANK else "warning"
    gpu = item["gpu"]
    meaning = CATALOGUE.get(fid, "a finding of gputop's exporter")
    where = f"GPU {gpu}" if gpu is not None else "the node"
    return NodeFinding(
        host=host, instance=instance, source="gputop", id=fid, severity=severity,
        title=f"{where}: {meaning}",
        evidence=f"gputop exporter on {host} reports {fid} active ({severity}) on {where}",
        fix="the node's own gputop has the evidence and the fix",
        next_step=f"gputop --hosts {host}" if host.replace("-", "").replace(".", "").isalnum()
        else "gputop --hosts NODE",
        gpu=gpu)


def build_nodes(data: FleetData, diagnoses: dict) -> dict[str, NodeView]:
    """Every node of the inventory with its GPUs' latest values and its findings."""
    nodes: dict[str, NodeView] = {}
    for key in sorted(data.gpus, key=lambda k: (k[0], k[1])):
        ref = data.gpus[key]
        node = nodes.get(ref.instance)
        if node is None:
            node = nodes[ref.instance] = NodeView(ref.instance, ref.host or ref.instance,
                                                  ref.source)
        def last(name: str, _key=key) -> float | None:
            return data.series.last(_key, name)

        view = GpuView(ref, util=last("util_gpu"), mem_used=last("mem_used"),
                       mem_total=last("mem_total"), power_w=last("power_w"),
                       sm_active=last("sm_active"))
        hour = data.util_hour.get(key)
        if hour is not None:
            view.util_hour = hour[0]
            view.seen_s = min(WASTE_WINDOW_S, hour[1] * data.sample_s)
        js = data.job_series.get(key, {})
        view.step_time_s, view.mfu = js.get("step_time_s"), js.get("mfu")
        view.goodput, view.j_per_step = js.get("goodput"), js.get("j_per_step")
        view.rank = data.ranks.get(key)
        held = bool(view.mem_used and view.mem_total and view.mem_used >= 0.05 * view.mem_total)
        found = job_of(ref, bool(js), held)
        view.job = found[0] if found else None
        node.gpus.append(view)
    for instance, node in nodes.items():
        jobs_on = {g.ref.gpu: g.job for g in node.gpus}
        if node.source == "gputop":
            for item in data.findings.get(instance, []):
                f = exporter_finding(node.host, instance, item)
                node.findings.append(_with_job(f, jobs_on))
        diag = diagnoses.get(instance)
        if diag is not None and node.source == "dcgm":
            for f in diag.findings():
                node.findings.append(_with_job(NodeFinding(
                    host=node.host, instance=instance, source="dcgm", id=f.id,
                    severity=f.severity, title=f.title, evidence=f.evidence, fix=f.fix,
                    next_step=f.next_step, cost_s=f.cost_s, gpu=f.gpu), jobs_on))
            node.notes = diag.notes()
        naming = data.namings.get(instance)
        if naming and node.source == "dcgm":
            node.notes.insert(0, f"series named as {naming} (read as such, units converted)")
        node.findings.sort(key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), -f.cost_s))
    return nodes


def _with_job(f: NodeFinding, jobs_on: dict[int, str | None]) -> NodeFinding:
    job = jobs_on.get(f.gpu) if f.gpu is not None else None
    if job is None and f.gpu is None:
        named = {j for j in jobs_on.values() if j}
        job = named.pop() if len(named) == 1 else None
    if job is None:
        return f
    from dataclasses import replace

    return replace(f, job=job)


def build_jobs(nodes: dict[str, NodeView]) -> list[JobView]:
    """A row per job, wasters first."""
    jobs: dict[str, JobView] = {}
    for node in nodes.values():
        for g in node.gpus:
            if g.job is None:
                continue
            job = jobs.get(g.job)
            if job is None:
                job = jobs[g.job] = JobView(g.job, g.job.split(":", 1)[0])
            job.gpus.append(g)
            if node.host not in job.nodes:
                job.nodes.append(node.host)
            for name in ("user", "partition", "namespace"):
                if g.ref.labels.get(name):
                    job.labels[name] = g.ref.labels[name]
        for f in node.findings:
            if f.job is not None and f.job in jobs:
                jobs[f.job].findings.append(f)
    for job in jobs.values():
        _summarise(job)
    return sorted(jobs.values(), key=lambda j: (-round(j.wasted_gpu_h, 3), -j.cost, j.key))


def _host_of(g: GpuView) -> str:
    return g.ref.host or g.ref.instance


def _summarise(job: JobView) -> None:
    utils = [g.util for g in job.gpus if g.util is not None]
    if utils:
        job.util_mean = statistics.fmean(utils)
        job.util_worst = min(utils)
    job.wasted_gpu_h = sum(g.wasted_gpu_h for g in job.gpus)
    for name in ("mfu", "goodput", "j_per_step"):
        values = [getattr(g, name) for g in job.gpus if getattr(g, name) is not None]
        if values:
            setattr(job, name, statistics.fmean(values))
    steps = [(g.step_time_s, g) for g in job.gpus if g.step_time_s]
    if steps:
        times = [s for s, _ in steps]
        median = statistics.median(times)
        job.step_time_s = median
        job.step_spread = (max(times) - min(times)) / median if median else None
        slow, g = max(steps, key=lambda x: x[0])
        if len(steps) >= 2 and median and slow >= median * (1 + STRAGGLER_STEP):
            rank = f"rank {g.rank} " if g.rank else ""
            job.straggler = (f"{rank}on {_host_of(g)} GPU {g.ref.gpu}: step "
                             f"{slow * 1e3:.0f} ms, +{(slow / median - 1) * 100:.0f}% over the "
                             f"median {median * 1e3:.0f} ms")
            return
    if len(utils) >= 2:
        median = statistics.median(utils)
        low = min((g for g in job.gpus if g.util is not None), key=lambda g: g.util)  # type: ignore
        if low.util is not None and median - low.util >= STRAGGLER_UTIL:
            job.straggler = (f"{_host_of(low)} GPU {low.ref.gpu}: {low.util:.0f}% busy, "
                             f"{median - low.util:.0f} points under the median {median:.0f}%")
