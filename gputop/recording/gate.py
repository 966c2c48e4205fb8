"""`report --baseline`: tell a regression from noise.

Two recordings of the same job never step at exactly the same rate: the machine's load, the
page cache and the clock move the figures by several percent (two back-to-back demo runs:
throughput -8 %, windowed p95 +21 %). A gate that compares two single figures fails on that
noise, and a gate that fails on noise gets switched off. So the gate compares the two runs'
*distributions* of step times, with their spread:

* **The samples.** Each recording holds the main job's step count at every sample (once a
  second). Each interval between two samples in which steps advanced gives one mean step
  time, seconds / steps; an interval is merged with the next ones until it holds at least
  ``MIN_STEPS`` steps (a slow job's second holds 3 or 4 steps, and counting whole steps would
  round its step time by up to 30 %; a stall counts too), and the interval that holds the first
  step (start-up) is left out. A run of 40 s at 10 steps/s or more gives about 38 step times. They are kept in metrics.json (``step_intervals_s``),
  so a metrics.json baseline works too.
* **The test.** A one-sided Mann-Whitney U test (rank-sum; normal approximation with a tie
  correction) asks whether the current run's step times are larger than the baseline's.
  It assumes nothing about their shape (a starved job's steps are far from normal).
* **The size.** The shift is the ratio of the two medians, minus one.

A run regressed when both hold: the test's p-value is below ``ALPHA`` (the shift is larger than
the spread of the two runs' own step times can explain: on a shared machine they wander by
2-5x within one run, so a single figure moves by 10-20 % between identical runs), and the shift
is larger than ``--max-regression`` (5 % by default: too small to matter). The message gives
the medians, the p-value and each run's spread (interquartile range over median). Recordings with fewer than ``MIN_INTERVALS`` step times each fall back to the single
figures (throughput, p95) against ``--max-regression``, and say so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

ALPHA = 0.01
MIN_INTERVALS = 6
MIN_STEPS = 5  # steps per step time at least: 1 step more or less moves it by 20 % at most
MAX_INTERVALS = 4000  # kept in metrics.json: ~1 hour at one sample a second


def step_intervals(processes: pd.DataFrame, pid: int | None) -> list[float]:
    """The mean step time of each sample interval of ``pid`` (see the module's docstring)."""
    if pid is None or processes.empty or "steps" not in processes:
        return []
    rows = processes[processes["pid"] == pid][["time", "steps"]].dropna()
    # One row per sample (a process on several GPUs has a row on each).
    series = rows.groupby("time")["steps"].max().sort_index()
    times, steps = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)
    out: list[float] = []
    started = False
    span = done = 0.0
    for i in range(1, len(times)):
        dt, ds = times[i] - times[i - 1], steps[i] - steps[i - 1]
        if dt <= 0 or ds < 0:  # a restart or a clock step: begin again
            span = done = 0.0
            continue
        if not started:  # the interval with the first steps holds the start-up
            started = ds > 0
            continue
        span, done = span + dt, done + ds
        if done >= MIN_STEPS:
            out.append(span / done)
            span = done = 0.0
    return [round(v, 6) for v in out[-MAX_INTERVALS:]]


def clean_intervals(value: Any) -> list[float]:
    """``step_intervals_s`` as read from a metrics.json (untrusted): positive finite numbers,
    at most MAX_INTERVALS; anything else gives none (the gate then uses the single figures)."""
    if not isinstance(value, list) or len(value) > MAX_INTERVALS:
        return []
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v) and v > 0 for v in value):
        return []
    return [float(v) for v in value]


def mann_whitney_greater(x: list[float], y: list[float]) -> float:
    """One-sided p-value that ``x`` tends to be larger than ``y`` (Mann-Whitney U, normal
    approximation with continuity and tie corrections)."""
    n1, n2 = len(x), len(y)
    ranks = pd.Series(list(x) + list(y)).rank(method="average").to_numpy()
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    n = n1 + n2
    _, counts = np.unique(np.asarray(list(x) + list(y)), return_counts=True)
    ties = float(((counts ** 3) - counts).sum())
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


def spread(values: list[float]) -> float:
    """Interquartile range over median: how much one run's step times wander."""
    q25, q50, q75 = np.percentile(values, [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else math.inf


def compare_steps(current: list[float], baseline: list[float], max_regression: float
                  ) -> tuple[bool, str] | None:
    """(regressed, why) from the step-time distributions, or None with too few samples."""
    if len(current) < MIN_INTERVALS or len(baseline) < MIN_INTERVALS:
        return None
    cur_m, base_m = float(np.median(current)), float(np.median(baseline))
    if base_m <= 0:
        return None
    shift = cur_m / base_m - 1
    p = mann_whitney_greater(current, baseline)
    noise = max(spread(current), spread(baseline))  # shown: what the test weighed
    regressed = p < ALPHA and shift > max_regression
    text = (f"median step time {cur_m * 1000:.1f} vs {base_m * 1000:.1f} ms ({shift * 100:+.1f}%, "
            f"{len(current)} vs {len(baseline)} intervals), Mann-Whitney p={p:.2g}, "
            f"spread (IQR/median) up to {noise * 100:.0f}%")
    return regressed, text


def _positive(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) and value > 0 else None


def mfu_problem(current: dict[str, Any], baseline: dict[str, Any], max_regression: float,
                mfu_text: str) -> str | None:
    """MFU that fell for a reason other than the step time, which the step test weighs: MFU is
    FLOPs per step x steps/s / peak, and FLOPs per step and the peak carry no noise. A drop of
    FLOPs per step / peak by more than ``max_regression`` is a regression (the same steps do
    less of the GPU's work: a narrower model, another precision)."""
    cur_f, base_f = _positive(current.get("flops_per_step")), _positive(baseline.get("flops_per_step"))
    cur_p, base_p = _positive(current.get("peak_flops")), _positive(baseline.get("peak_flops"))
    if cur_f is None or base_f is None or cur_p is None or base_p is None:
        return None
    change = (cur_f / cur_p) / (base_f / base_p) - 1
    if change >= -max_regression:
        return None
    return f"{mfu_text}: FLOPs per step of the peak {change * 100:+.1f}%"


def figures_note(current: dict[str, Any], baseline: dict[str, Any]) -> str:
    """The single figures, for the reader (not gated on)."""
    parts = []
    cur_t, base_t = current.get("throughput_steps_per_s"), baseline.get("throughput_steps_per_s")
    if cur_t and base_t:
        parts.append(f"throughput {cur_t:.3g} vs {base_t:.3g} steps/s "
                     f"({(cur_t / base_t - 1) * 100:+.1f}%)")
    cur_p, base_p = current.get("step_time_p95_s"), baseline.get("step_time_p95_s")
    if cur_p and base_p:
        parts.append(f"p95 {cur_p * 1000:.1f} vs {base_p * 1000:.1f} ms "
                     f"({(cur_p / base_p - 1) * 100:+.1f}%)")
    return "; ".join(parts)
