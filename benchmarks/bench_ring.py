"""numpy against the standard library for the monitor's history rings (issue 40).

The monitor loads numpy after its first frame for the history's ring buffers (gputop/core/history.py
`_Ring`: one float64 time and one float32 value per point), the charts' binning and the live
rules' window fits. numpy costs ~10 MiB of RSS (its import; measure below). Would the stdlib
`array` module do the same work at the same CPU? This times, per series and tick, what the
monitor does with a ring, with the same data:

- append: one point written at the head (every series, every tick);
- window: the last N points in time order (each chart, each frame);
- bin: those N points averaged into 80 columns (a chart's width).

Usage: python benchmarks/bench_ring.py [--capacity 3600] [--window 300] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from array import array


class NumpyRing:
    def __init__(self, capacity: int) -> None:
        import numpy as np

        self.np = np
        self.t = np.zeros(capacity, dtype=np.float64)
        self.v = np.zeros(capacity, dtype=np.float32)
        self.capacity, self.size, self.head = capacity, 0, 0

    def append(self, t: float, v: float) -> None:
        self.t[self.head] = t
        self.v[self.head] = v
        self.head = (self.head + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def last(self, n: int):
        np = self.np
        idx = np.arange(self.head - n, self.head) % self.capacity
        return self.t[idx], self.v[idx]

    def bin(self, n: int, columns: int) -> list[float]:
        np = self.np
        _, v = self.last(n)
        edges = np.linspace(0, n, columns + 1).astype(np.int64)
        sums = np.add.reduceat(v.astype(np.float64), edges[:-1])
        counts = np.diff(edges)
        return (sums / np.maximum(counts, 1)).tolist()


class ArrayRing:
    def __init__(self, capacity: int) -> None:
        self.t = array("d", bytes(8 * capacity))
        self.v = array("f", bytes(4 * capacity))
        self.capacity, self.size, self.head = capacity, 0, 0

    def append(self, t: float, v: float) -> None:
        self.t[self.head] = t
        self.v[self.head] = v
        self.head = (self.head + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def last(self, n: int):
        start = self.head - n
        if start >= 0:
            return self.t[start:self.head], self.v[start:self.head]
        return self.t[start:] + self.t[:self.head], self.v[start:] + self.v[:self.head]

    def bin(self, n: int, columns: int) -> list[float]:
        _, v = self.last(n)
        out = []
        for c in range(columns):
            lo, hi = c * n // columns, (c + 1) * n // columns
            out.append(sum(v[lo:hi]) / (hi - lo) if hi > lo else 0.0)
        return out


def cpu_us(fn, repeat: int) -> float:
    start = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - start) / repeat * 1e6


def rss_of_import(module: str) -> float:
    code = (f"import {module}\n" if module else "") + (
        "print([int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')][0])")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return int(out.stdout) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=3600)
    ap.add_argument("--window", type=int, default=300)
    ap.add_argument("--columns", type=int, default=80)
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    print(f"ring of {args.capacity} points, window {args.window}, {args.columns} columns; "
          f"CPU per call, best of 5 rounds of {args.repeat}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    rings = {"numpy": NumpyRing(args.capacity), "array": ArrayRing(args.capacity)}
    for ring in rings.values():
        for i in range(args.capacity + 123):  # full, wrapped
            ring.append(float(i), float(i % 97))
    same = all(abs(a - b) < 1e-3 for a, b in zip(rings["numpy"].bin(args.window, args.columns),
                                                 rings["array"].bin(args.window, args.columns)))
    print(f"  the same columns from both: {same}")
    print(f"  {'':8} {'append':>10} {'window':>10} {'bin':>10}  (us)")
    for name, ring in rings.items():
        k = [0.0]

        def append(ring=ring, k=k):
            k[0] += 1.0
            ring.append(k[0], 1.0)

        figures = [min(cpu_us(fn, args.repeat) for _ in range(5)) for fn in (
            append, lambda ring=ring: ring.last(args.window),
            lambda ring=ring: ring.bin(args.window, args.columns))]
        print(f"  {name:8} " + " ".join(f"{f:10.2f}" for f in figures))
    base, with_numpy = rss_of_import(""), rss_of_import("numpy")
    print(f"RSS of a bare interpreter {base:.1f} MiB, after `import numpy` {with_numpy:.1f} MiB "
          f"(+{with_numpy - base:.1f}); `array` is built in")
    return 0


if __name__ == "__main__":
    sys.exit(main())
