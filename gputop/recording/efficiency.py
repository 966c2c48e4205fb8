"""MFU, goodput and energy per step of a recorded training job, over the recording.

* MFU over the run: the FLOPs of the counted step x the run's throughput (steps done / time) over
  the peak the live figure used (the last sample's).
* Goodput over the run: the agent's ledger is cumulative since the process started, so the time
  booked during the recording is its last sample minus its first; a job that started after the
  recording began is booked whole (its start-up included).
* Energy per step: the energy counter of the job's GPU from the process's first sample to its
  last, over the steps it did meanwhile; per sample, over the samples of the counted step.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gputop.core.efficiency import (
    flops_text,
    goodput_breakdown,
    joules_text,
    share_text,
)
from gputop.recording.store import GOODPUT_COLUMNS, Recording

# metrics.json keys (kept flat, as the other metrics are).
METRIC_KEYS = ("mfu", "achieved_flops_per_s", "flops_per_step", "precision", "peak_flops",
               "device", "goodput", "goodput_seconds", "job_energy_per_step_j",
               "job_energy_per_sample_j")


def _last(p: pd.DataFrame, column: str) -> Any:
    if column not in p:
        return None
    values = p[column].dropna()
    if values.empty:
        return None
    value = values.iloc[-1]
    return value.item() if hasattr(value, "item") else value


def _float(value: Any, digits: int = 6) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(f"{value:.{digits}g}")


def _goodput(p: pd.DataFrame, recording_start: float | None, interval: float) -> dict[str, Any]:
    columns = [c for c in GOODPUT_COLUMNS.values() if c in p]
    if not columns:
        return {"goodput": None, "goodput_seconds": None}
    rows = p.dropna(subset=columns, how="all")
    if rows.empty:
        return {"goodput": None, "goodput_seconds": None}
    last = rows.iloc[-1]
    first = rows.iloc[0]
    # The job was already running when the recording began: book only what happened since.
    started_before = (recording_start is not None
                      and float(first["time"]) <= recording_start + 2 * max(interval, 0.5)
                      and len(rows) >= 2)
    seconds = {}
    for key, column in GOODPUT_COLUMNS.items():
        if column not in rows:
            continue
        end = _float(last[column])
        begin = _float(first[column]) if started_before else 0.0
        if end is not None:
            seconds[key] = round(max(0.0, end - (begin or 0.0)), 3)
    total = sum(seconds.values())
    return {"goodput": _float(seconds.get("productive", 0.0) / total) if total > 0 else None,
            "goodput_seconds": seconds or None}


def _energy_per_step(p: pd.DataFrame, gpus: pd.DataFrame) -> float | None:
    """The GPU's energy counter between the process's first and last steps sample."""
    if gpus.empty or "steps" not in p or p["gpu"].dropna().empty:
        return None
    rows = p.dropna(subset=["steps"]).sort_values("time")
    if len(rows) < 2:
        return None
    gpu = int(rows["gpu"].dropna().mode().iloc[0])
    g = gpus[(gpus["gpu"] == gpu)].dropna(subset=["energy_j"]).sort_values("time")
    if len(g) < 2:
        return None
    t0, t1 = float(rows["time"].iloc[0]), float(rows["time"].iloc[-1])
    e = g.set_index("time")["energy_j"]
    e0, e1 = e[e.index <= t0], e[e.index <= t1]
    if e0.empty or e1.empty:
        return None
    steps = float(rows["steps"].iloc[-1] - rows["steps"].iloc[0])
    joules = float(e1.iloc[-1] - e0.iloc[-1])
    return joules / steps if steps > 0 and joules >= 0 else None


def process_efficiency(p: pd.DataFrame, rec: Recording, throughput: float | None
                       ) -> dict[str, Any]:
    """The efficiency figures of one process over the recording."""
    out: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    if "flops_per_step" not in p:
        return out  # recorded before efficiency columns existed
    p = p.sort_values("time")
    per_step = _float(_last(p, "flops_per_step"))
    peak = _float(_last(p, "peak_flops"))
    out.update(flops_per_step=per_step, peak_flops=peak, precision=_last(p, "precision"),
               device=_last(p, "device"))
    if per_step and throughput:
        out["achieved_flops_per_s"] = _float(per_step * throughput)
        if peak:
            out["mfu"] = _float(per_step * throughput / peak)
    times = pd.concat([rec.gpus.get("time", pd.Series(dtype=float)),
                       rec.host.get("time", pd.Series(dtype=float))])
    start = float(times.min()) if len(times) else None
    interval = float(rec.meta.get("interval_s") or 1.0) if isinstance(
        rec.meta.get("interval_s"), (int, float)) else 1.0
    out.update(_goodput(p, start, interval))
    j_per_step = _energy_per_step(p, rec.gpus)
    out["job_energy_per_step_j"] = _float(j_per_step)
    samples = _float(_last(p, "samples_per_step"))
    out["job_energy_per_sample_j"] = _float(j_per_step / samples) if j_per_step and samples else None
    return out


def add_efficiency(procs: list[dict[str, Any]], rec: Recording) -> None:
    """Each process summary gets its efficiency figures (in place)."""
    if rec.processes.empty:
        return
    by_pid = {int(pid): p for (pid,), p in rec.processes.groupby(["pid"])}
    for proc in procs:
        frame = by_pid.get(int(proc["pid"]))
        if frame is not None:
            proc.update(process_efficiency(frame, rec, proc.get("throughput_steps_per_s")))


def efficiency_metrics(main: dict[str, Any] | None) -> dict[str, Any]:
    """The main job's efficiency keys for metrics.json (None when unknown)."""
    return {key: (main or {}).get(key) for key in METRIC_KEYS}


def compare_mfu(current: dict, baseline: dict, max_regression: float
                ) -> tuple[list[str], list[str]]:
    """(problems, notes): MFU that fell by more than ``max_regression`` is a regression."""
    cur, base = current.get("mfu"), baseline.get("mfu")
    if not isinstance(cur, (int, float)) or not isinstance(base, (int, float)) or base <= 0:
        return [], []
    change = cur / base - 1
    text = f"MFU {share_text(cur)} vs {share_text(base)} ({change * 100:+.1f}%)"
    return ([text], []) if change < -max_regression else ([], [text])


def efficiency_lines(summary: dict[str, Any]) -> list[str]:
    """The report's efficiency block: MFU, goodput with its breakdown, J/step, per job."""
    lines = []
    for proc in summary.get("jobs") or []:
        full = next((p for p in summary["processes"] if p["pid"] == proc["pid"]), None)
        if full is None or all(full.get(k) is None for k in METRIC_KEYS):
            continue
        lines.append(f"efficiency of pid {full['pid']}"
                     + (f" on GPU {full['gpu']}" if full.get("gpu") is not None else "") + ":")
        if full.get("mfu") is not None:
            lines.append(f"  MFU {share_text(full['mfu'])}: {flops_text(full['flops_per_step'])}"
                         f"/step ({full.get('precision')}) x "
                         f"{full['throughput_steps_per_s']:.3g} steps/s = "
                         f"{flops_text(full['achieved_flops_per_s'])}/s of "
                         f"{flops_text(full['peak_flops'])}/s ({full.get('device')} dense "
                         "datasheet peak)")
        elif full.get("achieved_flops_per_s") is not None:
            lines.append(f"  MFU n/a (no datasheet peak): achieved "
                         f"{flops_text(full['achieved_flops_per_s'])}/s")
        else:
            lines.append("  MFU n/a: no FLOP count from the agent")
        seconds = full.get("goodput_seconds") or {}
        if full.get("goodput") is not None:
            lines.append(f"  goodput {share_text(full['goodput'])} of "
                         f"{sum(seconds.values()):.0f} s: {goodput_breakdown(seconds)}")
        else:
            lines.append("  goodput n/a: no ledger from the agent")
        energy = full.get("job_energy_per_step_j")
        if energy is not None:
            per_sample = full.get("job_energy_per_sample_j")
            lines.append(f"  energy {joules_text(energy)}/step"
                         + (f", {joules_text(per_sample)}/sample" if per_sample else "")
                         + " (the GPU's energy counter over the steps recorded)")
        else:
            lines.append("  energy per step n/a (no energy counter, or no steps recorded)")
    return lines
