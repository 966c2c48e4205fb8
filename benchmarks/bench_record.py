"""The recorder over a long run: 8 simulated GPUs sampled at 1 s, with the clock sped up.

The simulated driver and the snapshots follow a virtual clock that advances 1 s per tick, so
24 hours of recording run in minutes. The host side (psutil) is sampled for real every tick and
the live rules run on every snapshot, as in `gputop record`. Prints the recorder's peak RSS and
the bytes on disk per GPU-hour, measured in this run.

Usage: python benchmarks/bench_record.py [--hours 24] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from gputop.collect.host import HostCollector
from gputop.collect.nvml import NvmlCollector
from gputop.collect.sampler import Sampler
from gputop.diagnostics.live import LiveDiagnosis
from gputop.recording.store import Recorder, recording_meta
from gputop.sim import nvml as simnvml
from gputop.sim.scenarios import SCENARIOS


class VirtualClock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    start = time.time()
    sim_clock = VirtualClock(0.0)
    wall = VirtualClock(start)
    sim = simnvml.install(simnvml.SimulatedNvml(SCENARIOS["tour"], seed=1, clock=sim_clock))
    for index in range(len(SCENARIOS["tour"].gpus)):
        sim.set_processes(index, [os.getpid()])  # a real process, so process rows are written
    sampler = Sampler(NvmlCollector(), HostCollector(), clock=wall, simulated="tour")
    sampler.open()
    root = Path(tempfile.mkdtemp(prefix="gputop-bench-")) if args.out is None else args.out
    path = root / "run.parquet"
    recorder = Recorder(path, flush_every=30.0)
    diagnosis = LiveDiagnosis()
    proc = psutil.Process()
    ticks = int(args.hours * 3600)
    rss_samples = []
    t0 = time.perf_counter()
    for tick in range(ticks):
        sim_clock.t = float(tick)
        wall.t = start + tick
        snap = sampler.sample()
        if tick == 0:
            recorder.create(recording_meta(snap, 1.0))
        recorder.add(snap, [t.to_json("bench") for t in diagnosis.update(snap)])
        if tick % 600 == 0:
            rss_samples.append((tick, proc.memory_info().rss))
        if tick % 3600 == 0 and tick:
            print(f"  {tick / 3600:4.0f} h simulated, {time.perf_counter() - t0:6.0f} s elapsed, "
                  f"RSS {proc.memory_info().rss / 2**20:.0f} MiB", flush=True)
    recorder.flush()
    elapsed = time.perf_counter() - t0
    sampler.close()
    simnvml.uninstall()

    gpus = len(SCENARIOS["tour"].gpus)
    size = dir_bytes(path)
    gpu_hours = gpus * args.hours
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    first_hour = max(r for t, r in rss_samples if t <= 3600)
    last = rss_samples[-1][1]
    print(f"simulated {args.hours:g} h of 8 GPUs at 1 s: {ticks} samples in {elapsed:.0f} s "
          f"({elapsed / ticks * 1000:.2f} ms per tick, sampling + rules + recording)")
    print(f"peak RSS of the recorder: {peak / 2**20:.1f} MiB "
          f"(after 1 h: {first_hour / 2**20:.1f} MiB, at the end: {last / 2**20:.1f} MiB)")
    print(f"on disk: {size / 2**20:.1f} MiB for {gpu_hours:g} GPU-hours = "
          f"{size / gpu_hours / 2**10:.0f} KiB per GPU-hour ({recorder.rows_written} rows)")
    if args.out is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
