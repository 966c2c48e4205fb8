"""What the live monitor's charts and history cost per frame, pure Python (issue 40) beside the
numpy version they replaced.

The monitor draws ~40 series a tick (10 GPUs x 4 fields: util, memory, power, PCIe), all over
the same times: ``chart_rows_many`` bins them in one pass per chart width. This times those
rows for 40 series of 60 points (the default 1-minute window at 1 s) and of 3600 points (the
1-hour window), at widths 60 and 150 cells and heights 2-3, and the history's ``record()`` of
one 10-GPU snapshot. The numpy version is the one on git ``main`` (or ``--ref``), imported from
a temporary copy; without git or numpy only the new figures print.

    python benchmarks/bench_charts.py [--ref main] [--repeat 200]

Prints ms per frame (the median of ``--repeat`` runs) and the ratio new / numpy.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gputop import history as new_history  # noqa: E402
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot  # noqa: E402
from gputop.tui.widgets import chart as new_chart  # noqa: E402

GPUS = 10
FIELDS = 4


def old_module(ref: str, path: str, name: str, tmp: Path):
    """The module at ``path`` as git ``ref`` has it, imported under ``name`` (None if absent)."""
    try:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    if "numpy" not in text:
        return None  # the ref is already pure Python: nothing to compare with
    file = tmp / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except ImportError:  # no numpy installed
        del sys.modules[name]
        return None
    return module


def series(points: int, seed: int) -> tuple[list[float], list[list[float]]]:
    """Times 1 s apart with a little jitter, and 40 series with a few missing values."""
    rng = random.Random(seed)
    t = [1000.0 + i + rng.uniform(0.0, 0.02) for i in range(points)]
    values = []
    for k in range(GPUS * FIELDS):
        v = [rng.uniform(0.0, 100.0) for _ in range(points)]
        if k % 7 == 0:  # a lost GPU's stretch
            v[points // 3: points // 2] = [math.nan] * (points // 2 - points // 3)
        values.append(v)
    return t, values


def per_frame(fn, repeat: int) -> float:
    """Median ms of one call."""
    fn()  # warm caches (the braille tables, imports)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def chart_case(module, np_mod, t, values, width: int, heights: list[int]):
    """A frame's chart rows as the panel asks for them: one call per chart width."""
    if np_mod is not None:  # the numpy version took the history's numpy arrays
        t = np_mod.asarray(t, dtype=np_mod.float64)
        values = [np_mod.asarray(v, dtype=np_mod.float32) for v in values]
    else:
        t = array("d", t)
        values = [array("f", v) for v in values]
    start, end = t[-1] - (t[-1] - t[0] + 1.0), float(t[-1])
    vmaxes = [100.0] * len(values)
    all_heights = heights * GPUS

    def run():
        module.chart_rows_many(t, values, start, end, vmaxes, width=width, heights=all_heights)
    return run


def snapshots(count: int) -> list[Snapshot]:
    rng = random.Random(1)
    out = []
    for i in range(count):
        gpus = tuple(GpuSample(index=g, util_gpu=rng.uniform(0, 100), mem_used=rng.randrange(1 << 30),
                               mem_total=1 << 34, power_w=rng.uniform(50, 700),
                               pcie_rx_mbs=rng.uniform(0, 1e4),
                               processes=(ProcSample(pid=100 + g, name="train",
                                                     cpu_percent=rng.uniform(0, 100)),))
                     for g in range(GPUS))
        out.append(Snapshot(float(i), HostSample("h", cpu_percent=rng.uniform(0, 100)),
                            DriverInfo(True), gpus))
    return out


def record_case(module, snaps: list[Snapshot]):
    h = module.History()
    for snap in snaps[:-1]:  # a history an hour old, rings full (the costly wrap)
        h.record(snap)
    last = snaps[-1]
    state = {"t": last.time}

    def run():
        state["t"] += 1.0
        h.record(Snapshot(state["t"], last.host, last.driver, last.gpus))
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="main", help="git ref of the numpy version (main)")
    parser.add_argument("--repeat", type=int, default=200, help="runs per figure (200)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_chart = old_module(args.ref, "gputop/tui/widgets/chart.py", "old_chart", Path(tmp))
        old_history = old_module(args.ref, "gputop/core/history.py", "old_history", Path(tmp))
    np_mod = None
    if old_chart is not None or old_history is not None:
        import numpy as np_mod  # type: ignore[no-redef]
    print(f"{'case':44} {'pure Python':>12} {'numpy':>10} {'ratio':>7}")

    def row(name: str, new_ms: float, old_ms: float | None) -> None:
        old = f"{old_ms:10.3f}" if old_ms is not None else f"{'-':>10}"
        ratio = f"{new_ms / old_ms:7.2f}" if old_ms else f"{'-':>7}"
        print(f"{name:44} {new_ms:9.3f} ms {old} {ratio}")

    for points in (60, 3600):
        t, values = series(points, seed=points)
        for width in (60, 150):
            for heights in ([2, 2, 2, 2], [3, 3, 2, 2]):
                name = f"40 series x {points} pts, width {width}, heights {heights[0]}-{heights[-1]}"
                repeat = args.repeat if points <= 600 else max(10, args.repeat // 10)
                new_ms = per_frame(chart_case(new_chart, None, t, values, width, heights), repeat)
                old_ms = (per_frame(chart_case(old_chart, np_mod, t, values, width, heights), repeat)
                          if old_chart is not None else None)
                row(name, new_ms, old_ms)
    snaps = snapshots(3601)
    new_ms = per_frame(record_case(new_history, snaps), args.repeat)
    old_ms = (per_frame(record_case(old_history, snaps), args.repeat)
              if old_history is not None else None)
    row(f"History.record, {GPUS} GPUs (rings full)", new_ms, old_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
