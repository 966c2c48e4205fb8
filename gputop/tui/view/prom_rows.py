"""The rows of `gputop --prometheus`: jobs, a job's nodes, a node's GPUs. Pure, so it is tested
alone. Label values were escaped when they were read (``promfleet.sources``); a row keeps the
key Enter opens (a job key, or a node's instance)."""

from __future__ import annotations

import time

from rich.text import Text

from gputop.core.format import bytes_h, pct, truncate
from gputop.fleet.prometheus.jobs import GpuView, JobView, NodeFinding, NodeView
from gputop.fleet.prometheus.monitor import FleetState
from gputop.tui.view.fleet_rows import FleetRow

_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}
SPARK = "▁▂▃▄▅▆▇█"
JOB_W = 28


def _num(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def summary_text(state: FleetState, url: str, width: int) -> Text:
    gpus = sum(len(n.gpus) for n in state.nodes.values())
    text = Text(f" gputop fleet · {url} · {len(state.nodes)} nodes, {gpus} GPUs, "
                f"{len(state.jobs)} jobs · refresh {state.refresh_s:g} s", style="bold")
    if not state.ok:
        age = "" if state.data_time is None else \
            f" · last data {time.time() - state.data_time:.0f} s old"
        wait = "" if state.retry_at is None else \
            f" · retry in {max(0.0, state.retry_at - time.monotonic()):.0f} s"
        text.append(f"  prometheus: {state.error or 'connecting…'}{age}{wait}",
                    style="bold red" if state.error else "dim")
    text.truncate(width)
    return text


def job_header(width: int) -> Text:
    line = (f"{'JOB':<{JOB_W}} {'NODES':>5} {'GPUS':>4} {'UTIL':>5} {'WORST':>5} "
            f"{'WASTED':>7} {'STEP':>8} {'SPREAD':>6} {'MFU':>5} {'GOODPUT':>7}  FINDINGS")
    return Text(line[:width], style="bold")


def job_rows(jobs: list[JobView], width: int, dim: bool) -> list[FleetRow]:
    rows = []
    for job in jobs:
        step = "-" if job.step_time_s is None else f"{job.step_time_s * 1e3:.0f}ms"
        spread = "-" if job.step_spread is None else f"{job.step_spread * 100:.0f}%"
        mfu = "-" if job.mfu is None else f"{job.mfu * 100:.0f}%"
        good = "-" if job.goodput is None else f"{job.goodput * 100:.0f}%"
        line = (f"{truncate(job.key, JOB_W):<{JOB_W}} {len(job.nodes):>5} {len(job.gpus):>4} "
                f"{pct(job.util_mean):>5} {pct(job.util_worst):>5} "
                f"{job.wasted_gpu_h:>6.2f}h {step:>8} {spread:>6} {mfu:>5} {good:>7}  ")
        text = Text(line, style="dim" if dim else "")
        ids = sorted({f.id for f in job.findings})
        worst = max((f.severity for f in job.findings),
                    key=lambda s: ("info", "warning", "critical").index(s), default=None)
        text.append(", ".join(ids) if ids else "ok",
                    style="dim" if dim else _SEVERITY_STYLE.get(worst or "", "green"))
        if job.straggler:
            text.append(f"  straggler: {job.straggler}", style="dim" if dim else "yellow")
        text.truncate(width)
        rows.append(FleetRow((job.key, None), job.key, None, text))
    return rows


def job_title(job: JobView, width: int) -> Text:
    text = Text(f" job {job.key}", style="bold")
    nodes = f"{len(job.nodes)} node" + ("s" if len(job.nodes) != 1 else "")
    text.append(f" · {nodes} · {len(job.gpus)} GPUs · util "
                f"{pct(job.util_mean)} mean, {pct(job.util_worst)} worst · "
                f"{job.wasted_gpu_h:.2f} GPU-h wasted in the last hour")
    if job.labels:
        text.append(" · " + " ".join(f"{k}={v}" for k, v in sorted(job.labels.items())))
    text.truncate(width)
    return text


def node_rows(job: JobView, nodes: dict[str, NodeView], width: int, dim: bool
              ) -> list[FleetRow]:
    """One row per node of the job, then the job's findings and its straggler."""
    rows = []
    for node in nodes.values():
        gpus = [g for g in node.gpus if g.job == job.key]
        if not gpus:
            continue
        utils = [g.util for g in gpus if g.util is not None]
        mean = sum(utils) / len(utils) if utils else None
        steps = [g.step_time_s for g in gpus if g.step_time_s]
        step = f"step {min(steps) * 1e3:.0f}-{max(steps) * 1e3:.0f} ms" if steps else ""
        found = [f for f in node.findings if f.job == job.key]
        line = (f"{truncate(node.host, 24):<24} {node.source:<6} {len(gpus):>2} GPUs  util "
                f"{pct(mean):>4} (min {pct(min(utils) if utils else None)})  {step:<18} ")
        text = Text(line, style="dim" if dim else "")
        text.append(", ".join(sorted({f.id for f in found})) or "ok",
                    style="dim" if dim else ("bold yellow" if found else "green"))
        text.truncate(width)
        rows.append(FleetRow((node.instance, None), node.instance, None, text))
    return rows


def finding_lines(findings: list[NodeFinding], width: int) -> list[FleetRow]:
    rows = []
    for i, f in enumerate(findings):
        where = f" GPU {f.gpu}" if f.gpu is not None else ""
        text = Text(f"{f.host}{where} ", style="bold")
        text.append(f"{f.id} ", style=_SEVERITY_STYLE.get(f.severity, ""))
        text.append(f"{f.title} — {f.evidence}")
        text.truncate(width)
        rows.append(FleetRow((f"finding-{i}", None), "", None, text))
        if f.next_step:
            rows.append(FleetRow((f"next-{i}", None), "", None,
                                 Text(f"    next: {truncate(f.next_step, width - 10)}",
                                      style="dim")))
    return rows


def spark(points: list[tuple[float, float]], width: int, top: float = 100.0) -> str:
    if not points:
        return ""
    values = [v for _, v in points][-width:]
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int(v / top * (len(SPARK) - 1) + 0.5)))]
                   for v in values)


def gpu_rows(node: NodeView, charts: dict[int, dict], width: int, dim: bool) -> list[FleetRow]:
    rows = []
    for g in node.gpus:
        rows.append(FleetRow((node.instance, g.ref.gpu), node.instance, g.ref.gpu,
                             _gpu_text(node, g, charts.get(g.ref.gpu, {}), width, dim)))
    return rows


def _gpu_text(node: NodeView, g: GpuView, chart: dict, width: int, dim: bool) -> Text:
    mem = (f"{bytes_h(g.mem_used, 'G')}/{bytes_h(g.mem_total, 'G')}"
           if g.mem_used is not None and g.mem_total is not None else "n/a")
    power = _num(g.power_w, ".0f") + "W"
    line = (f"{node.host} GPU {g.ref.gpu:<2} {truncate(g.ref.model or '?', 22):<22} "
            f"util {pct(g.util):>4} mem {mem:>11} {power:>6} {truncate(g.job or '-', 22):<22} ")
    text = Text(line, style="dim" if dim else "")
    util = spark(chart.get("util_gpu", []), max(0, width - len(line) - 1))
    if util:
        text.append(util, style="dim" if dim else "green")
    text.truncate(width)
    return text


def note_rows(notes: list[str], width: int) -> list[FleetRow]:
    return [FleetRow((f"note-{i}", None), "", None,
                     Text(truncate(f"coverage: {n}", width), style="dim"))
            for i, n in enumerate(notes)]
