"""Pure-text charts for reports: block sparklines with a fixed y-range (no Textual)."""

from __future__ import annotations

import math

import numpy as np

_BLOCKS = " ▁▂▃▄▅▆▇█"


def bin_means(times: np.ndarray, values: np.ndarray, start: float, end: float, bins: int) -> np.ndarray:
    """Mean per time bin over [start, end]; NaN where a bin has no sample."""
    out = np.full(bins, np.nan)
    keep = ~np.isnan(values)
    if bins <= 0 or end <= start or not keep.any():
        return out
    t, v = times[keep], values[keep]
    idx = np.clip(((t - start) / (end - start) * bins).astype(np.int64), 0, bins - 1)
    sums = np.bincount(idx, weights=v, minlength=bins)
    counts = np.bincount(idx, minlength=bins)
    filled = counts > 0
    out[filled] = sums[filled] / counts[filled]
    return out


def sparkline(values: np.ndarray, vmax: float) -> str:
    """One row of blocks scaled to [0, vmax]; a gap where there is no data."""
    if not math.isfinite(vmax) or vmax <= 0:
        vmax = 1.0
    chars = []
    for v in values:
        if np.isnan(v):
            chars.append(" ")
        else:
            level = int(round(min(max(v / vmax, 0.0), 1.0) * (len(_BLOCKS) - 1)))
            chars.append(_BLOCKS[max(level, 1) if v > 0 else 0])
    return "".join(chars)
