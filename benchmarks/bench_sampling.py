"""Time of one sampling tick: 8 simulated GPUs (`tour`) and a host with ~300 processes.

Prints the median and p95 of many ticks for the whole tick and for its parts (NVML, host,
processes), measured in this one run. Usage: python benchmarks/bench_sampling.py [--ticks N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import psutil

from gputop.session import open_sampler


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--processes", type=int, default=300)
    args = parser.parse_args()

    fillers = []
    while len(psutil.pids()) < args.processes:
        fillers.append(subprocess.Popen(["sleep", "600"]))
    try:
        with open_sampler("tour", agents=True, wait_for_workers=10.0) as sampler:
            sampler.sample()
            total, nvml, host = [], [], []
            for _ in range(args.ticks):
                t0 = time.perf_counter()
                sampler.sample()
                total.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                sampler.nvml.sample()
                nvml.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                sampler.host.sample_host()
                host.append(time.perf_counter() - t0)
            n_procs = len(psutil.pids())
            snap = sampler.sample()
    finally:
        for p in fillers:
            p.kill()
            p.wait()

    gpus = len(snap.gpus)
    tracked = sum(1 + len(p.workers) for g in snap.gpus for p in g.processes)
    print(f"host processes: {n_procs}, simulated GPUs: {gpus}, GPU processes+workers sampled: {tracked}")
    print(f"ticks measured: {args.ticks}")
    for name, values in (("whole tick", total), ("NVML (8 GPUs)", nvml), ("host (psutil)", host)):
        print(f"{name:<16} median {statistics.median(values) * 1000:7.2f} ms   "
              f"p95 {percentile(values, 0.95) * 1000:7.2f} ms")
    med = statistics.median(total)
    print(f"share of a 1 s interval spent sampling: {med * 100:.2f} %")


if __name__ == "__main__":
    main()
