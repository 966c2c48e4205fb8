"""Summaries of a recording: per-GPU and per-process figures, the benchmark metrics, baselines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gputop.recording.efficiency import add_efficiency, compare_mfu, efficiency_metrics
from gputop.recording.gate import (
    clean_intervals,
    compare_steps,
    figures_note,
    mfu_problem,
    step_intervals,
)
from gputop.recording.store import Recording, RecordingError, read_recording

THROTTLE_EVENTS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


def _f(value: Any, digits: int = 3) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else round(value, digits)


def _pct(series: pd.Series, q: float) -> float | None:
    s = series.dropna()
    return _f(np.percentile(s, q)) if len(s) else None


def _durations(times: np.ndarray) -> np.ndarray:
    """How long each sample stands for: the gap to the next one (the median gap for the last)."""
    if len(times) < 2:
        return np.ones(len(times))
    gaps = np.diff(times)
    return np.append(gaps, np.median(gaps))


def gpu_summary(g: pd.DataFrame) -> dict[str, Any]:
    g = g.sort_values("time")
    times = g["time"].to_numpy()
    dur = _durations(times)
    energy = None
    counter = g["energy_j"].dropna()
    if len(counter) >= 2:
        energy = float(counter.iloc[-1] - counter.iloc[0])
    elif g["power_w"].notna().sum() >= 2:
        p = g[["time", "power_w"]].dropna()
        trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 names it trapz
        energy = float(trapezoid(p["power_w"], p["time"]))
    throttled: dict[str, float] = {}
    events = g["clock_events"].fillna("").to_numpy()
    for reasons, d in zip(events, dur):
        for reason in reasons.split(","):
            if reason in THROTTLE_EVENTS:
                throttled[reason] = throttled.get(reason, 0.0) + float(d)
    any_throttle = float(sum(d for reasons, d in zip(events, dur)
                             if any(r in THROTTLE_EVENTS for r in reasons.split(","))))
    last = g.iloc[-1]
    return {
        "gpu": int(last["gpu"]),
        "name": last["name"],
        "samples": len(g),
        "util_mean": _f(g["util_gpu"].mean(), 1),
        "util_p5": _pct(g["util_gpu"], 5),
        "util_p50": _pct(g["util_gpu"], 50),
        "util_p95": _pct(g["util_gpu"], 95),
        "mem_peak": _f(g["mem_used"].max(), 0),
        "mem_total": _f(last["mem_total"], 0),
        "power_mean_w": _f(g["power_w"].mean(), 1),
        "energy_j": _f(energy, 1),
        "energy_kwh": _f(energy / 3.6e6, 4) if energy is not None else None,
        "throttled_s": round(any_throttle, 1),
        "throttled_by": {k: round(v, 1) for k, v in sorted(throttled.items())},
        "lost": bool(g["lost"].any()),
    }


def process_summary(p: pd.DataFrame) -> dict[str, Any]:
    """One process over the run (its rows on every GPU it used)."""
    p = p.sort_values("time")
    steps = p["steps"].dropna() if "steps" in p else pd.Series(dtype=float)
    throughput = None
    if len(steps) >= 2:
        t = p.loc[steps.index, "time"]
        span = float(t.iloc[-1] - t.iloc[0])
        if span > 0:
            # Exact over the run: steps done / time, not a mean of windowed rates.
            throughput = float(steps.iloc[-1] - steps.iloc[0]) / span
    last = p.iloc[-1]
    gpus = sorted(int(g) for g in p["gpu"].dropna().unique())
    command = last["command"] if "command" in p and isinstance(last["command"], str) else None
    gpu_mem = p["gpu_mem"].dropna() if "gpu_mem" in p else pd.Series(dtype=float)
    return {
        "pid": int(last["pid"]),
        "name": last["name"],
        "command": command or last["name"],
        "gpu": gpus[0] if gpus else None,
        "gpus": gpus,
        "gpu_mem_peak": _f(gpu_mem.max(), 0) if len(gpu_mem) else None,
        "samples": len(p),
        "cpu_mean": _f(p["cpu_percent"].mean(), 1),
        "workers": int(last["workers"]),
        "user": last["user"] if "user" in p and isinstance(last["user"], str) else None,
        "steps": None if steps.empty else int(steps.iloc[-1]),
        "throughput_steps_per_s": _f(throughput, 4),
        # The agent reports p50/p95 over a sliding window; the run's figure is the median of
        # those windows (a percentile of percentiles would follow the single worst window).
        "step_time_p50_s": _pct(p["step_time_p50_s"], 50) if "step_time_p50_s" in p else None,
        "step_time_p95_s": _pct(p["step_time_p95_s"], 50) if "step_time_p95_s" in p else None,
        "dataloader_wait_share": _f(p["dataloader_wait_share"].mean(), 3)
        if "dataloader_wait_share" in p else None,
    }


def summarize(rec: Recording) -> dict[str, Any]:
    gpus = [gpu_summary(g) for _, g in rec.gpus.groupby("gpu")] if not rec.gpus.empty else []
    procs = []
    if not rec.processes.empty:
        procs = reported_processes(
            [process_summary(p) for _, p in rec.processes.groupby(["pid"], dropna=False)],
            gpus_recorded=bool(gpus), user=rec.meta.get("user"))
        add_efficiency(procs, rec)  # MFU, goodput, J/step over the recording
    times = pd.concat([rec.gpus.get("time", pd.Series(dtype=float)),
                       rec.host.get("time", pd.Series(dtype=float))])
    findings = []
    if not rec.findings.empty:
        for row in rec.findings.sort_values("time").to_dict("records"):
            findings.append({k: (None if isinstance(v, float) and math.isnan(v) else v)
                             for k, v in row.items()})
    metrics = benchmark_metrics(rec.meta, gpus, procs, _f(times.max() - times.min(), 1))
    main = metrics["job"]["pid"] if metrics["job"] else None
    metrics["step_intervals_s"] = step_intervals(rec.processes, main)  # for the gate
    return {
        "recording": str(rec.path),
        "meta": rec.meta,
        "start": _f(times.min(), 3),
        "end": _f(times.max(), 3),
        "duration_s": _f(times.max() - times.min(), 1),
        "gpus": gpus,
        "processes": procs,
        "findings": findings,
        "jobs": [_job(p, figures=True) for p in training_jobs(procs)],
        "metrics": metrics,
    }


def reported_processes(procs: list[dict], gpus_recorded: bool, user: Any = None) -> list[dict]:
    """The processes the report is about. With GPUs recorded, those that ran on them: another
    job on the host with no GPU (a test, another user's CPU run with an agent) is not what
    the recording measures, and must never stand for its job. Without GPUs (no driver), the
    processes whose agent reported steps. A row with nothing to show is left out."""
    if gpus_recorded:
        return [p for p in procs if p["gpus"]]
    trainers = [p for p in procs if p["steps"] is not None]
    # Without GPUs nothing ties a job to the recording but its agent, and root sees every
    # user's agents: the recorder's own jobs, when it has any, are the ones it measures.
    own = [p for p in trainers if isinstance(user, str) and p.get("user") == user]
    return own or trainers


def process_rows(rec: Recording, summary: dict[str, Any]) -> pd.DataFrame:
    """The recorded samples of the processes ``summary`` reports (for their charts)."""
    if rec.processes.empty:
        return rec.processes
    return rec.processes[rec.processes["pid"].isin([p["pid"] for p in summary["processes"]])]


def training_jobs(procs: list[dict]) -> list[dict]:
    """The processes whose agent reported steps, the one that drives the GPUs first.

    ``procs`` are the reported ones (``reported_processes``): with GPUs recorded, only jobs on
    them. The job on more GPUs comes first, then with more GPU memory, with more steps. The
    ranks of one job step together, so one rank's rate is the job's rate."""
    trainers = [p for p in procs if p["throughput_steps_per_s"] is not None]
    return sorted(trainers, key=lambda p: (not p["gpus"], -len(p["gpus"]),
                                           -(p["gpu_mem_peak"] or 0), -(p["steps"] or 0), p["pid"]))


JOB_FIGURES = ("throughput_steps_per_s", "step_time_p50_s", "step_time_p95_s",
               "dataloader_wait_share")


def _job(p: dict, figures: bool = False) -> dict[str, Any]:
    job = {"pid": p["pid"], "command": p["command"], "gpus": p["gpus"]}
    if figures:
        job.update({k: p[k] for k in JOB_FIGURES})
    return job


def benchmark_metrics(meta: dict, gpus: list[dict], procs: list[dict], duration: float | None) -> dict:
    """The canonical summary for benchmarks and CI gates (``metrics.json``): the figures of the
    main training job (named in ``job``) and of the GPUs."""
    jobs = training_jobs(procs)
    main = jobs[0] if jobs else None
    energy = [g["energy_j"] for g in gpus if g["energy_j"] is not None]
    total_energy = sum(energy) if energy else None
    steps = None
    if main and main["throughput_steps_per_s"] and duration:
        steps = main["throughput_steps_per_s"] * duration
    utils = [g["util_mean"] for g in gpus if g["util_mean"] is not None]
    peaks = [g["mem_peak"] for g in gpus if g["mem_peak"] is not None]
    return {
        "job": _job(main) if main else None,
        "throughput_steps_per_s": main["throughput_steps_per_s"] if main else None,
        "step_time_p50_s": main["step_time_p50_s"] if main else None,
        "step_time_p95_s": main["step_time_p95_s"] if main else None,
        "dataloader_wait_share": main["dataloader_wait_share"] if main else None,
        "peak_gpu_memory_bytes": max(peaks) if peaks else None,
        "mean_gpu_utilization": _f(sum(utils) / len(utils), 1) if utils else None,
        "energy_j": _f(total_energy, 1),
        "energy_per_step_j": _f(total_energy / steps, 3) if total_energy and steps else None,
        "duration_s": duration,
        **efficiency_metrics(main),
        "environment": {
            "host": meta.get("host"),
            "driver_version": meta.get("driver_version"),
            "cuda_version": meta.get("cuda_version"),
            "gpu_models": sorted({str(g["name"]) for g in meta.get("gpus", []) if g.get("name")}),
            "gputop_version": meta.get("gputop_version"),
            "simulated": meta.get("simulated"),
        },
    }


def default_metrics_path(recording: Path) -> Path:
    """``run.parquet`` -> ``run.parquet.metrics.json`` beside it: one file per recording, so
    two recordings in one folder keep their own."""
    recording = recording.resolve()
    return recording.parent / f"{recording.name}.metrics.json"


def load_metrics(path: Path) -> dict[str, Any]:
    """Metrics of a recording directory or of a ``metrics.json`` file."""
    if not path.is_dir():  # a file (or a FIFO, a device: refused unread, never waited on)
        from gputop.recording.untrusted import UntrustedFile, read_json

        try:
            data = read_json(path)
        except UntrustedFile as exc:
            raise RecordingError(f"cannot read {path}: {exc}") from None
        if not isinstance(data, dict) or "throughput_steps_per_s" not in data:
            raise RecordingError(f"{path} is not a gputop metrics.json")
        return data
    return summarize(read_recording(path))["metrics"]


def parse_regression(text: str) -> float:
    """'5%', '5' and '0.05' all mean five percent."""
    raw = text.strip().rstrip("%")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"--max-regression takes a percentage like 5% (got {text!r})") from None
    if value < 0:
        raise ValueError("--max-regression must not be negative")
    return value / 100 if (text.strip().endswith("%") or value >= 1) else value


def compare(current: dict, baseline: dict, max_regression: float) -> tuple[bool, str]:
    """(regressed, one-line reason) against a baseline: the step-time distributions with their
    spread (gputop.recording.gate), and MFU when both have it; with too few step times, the
    single figures (throughput, p95 step time) against ``max_regression``."""
    steps = compare_steps(clean_intervals(current.get("step_intervals_s")),
                          clean_intervals(baseline.get("step_intervals_s")), max_regression)
    if steps is not None:
        if current.get("throughput_steps_per_s") is None:
            raise RecordingError("no throughput to compare (record a job started with "
                                 "`gputop run` so its agent reports steps)")
        # MFU follows the step rate (same FLOPs per step), so the step test decides; MFU and
        # the single figures are shown, not gated on (they carry the noise the test weighs).
        regressed, text = steps
        _, mfu_notes = compare_mfu(current, baseline, math.inf)
        mfu = mfu_problem(current, baseline, max_regression, mfu_notes[0]) if mfu_notes else None
        problems = [p for p in (mfu, text if regressed else None) if p]
        notes = ([] if regressed else [text]) + ([] if mfu else mfu_notes) \
            + [figures_note(current, baseline)]
        limit = f"fails when p<0.01 and the median rose by over {max_regression * 100:g}%"
        if problems:
            return True, f"regression: {'; '.join(filter(None, problems))} ({limit})"
        return False, f"no regression: {'; '.join(filter(None, notes))} ({limit})"
    problems, notes = [], []
    cur_t, base_t = current.get("throughput_steps_per_s"), baseline.get("throughput_steps_per_s")
    if cur_t is None or base_t is None or base_t <= 0:
        raise RecordingError("no throughput to compare (record a job started with "
                             "`gputop run` so its agent reports steps)")
    change = cur_t / base_t - 1
    text = f"throughput {cur_t:.3g} vs {base_t:.3g} steps/s ({change * 100:+.1f}%)"
    (problems if change < -max_regression else notes).append(text)
    mfu_problems, mfu_notes = compare_mfu(current, baseline, max_regression)
    problems += mfu_problems
    notes += mfu_notes
    cur_p, base_p = current.get("step_time_p95_s"), baseline.get("step_time_p95_s")
    if cur_p is not None and base_p:
        change = cur_p / base_p - 1
        text = f"p95 step time {cur_p * 1000:.1f} vs {base_p * 1000:.1f} ms ({change * 100:+.1f}%)"
        (problems if change > max_regression else notes).append(text)
    limit = f"limit {max_regression * 100:g}%; too few step times for the distribution test"
    if problems:
        return True, f"regression: {'; '.join(problems)} ({limit})"
    return False, f"no regression: {'; '.join(notes)} ({limit})"
