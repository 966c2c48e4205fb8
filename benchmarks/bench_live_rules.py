"""The live rules' cost per tick as history accumulates: 10 simulated GPUs (`--demo tour`) at
1 s, on a simulated clock, so 11 minutes of history are built in seconds.

The snapshots are sampled for real (simulated NVML, psutil on this host) one simulated second
apart, then fed to ``LiveDiagnosis.update`` one at a time, as the monitor and `gputop watch` do.
Each tick is timed on several independent LiveDiagnosis instances fed in lockstep and the
fastest is kept (a busy machine only ever adds time); the figure per minute of history is the
median of its ticks. The rules' per-tick work must not grow with the history they keep: the
goal is the 10th minute within 1.2x of the first.

Usage: python benchmarks/bench_live_rules.py [--minutes 11] [--copies 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputop.collect.nvml import NvmlCollector  # noqa: E402
from gputop.collect.sampler import Sampler  # noqa: E402
from gputop.diagnostics.live import LiveDiagnosis  # noqa: E402
from gputop.sim import nvml as simnvml  # noqa: E402
from gputop.sim.scenarios import SCENARIOS  # noqa: E402

GOAL_RATIO = 1.2


class VirtualClock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def sample_history(seconds: int) -> list:
    """``seconds`` snapshots of the tour, one simulated second apart."""
    start = time.time()
    sim_clock, wall = VirtualClock(0.0), VirtualClock(start)
    scenario = SCENARIOS["tour"]
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, seed=1, clock=sim_clock))
    try:
        for index in range(len(scenario.gpus)):
            sim.set_processes(index, [os.getpid()])  # a real process behind every GPU
        sampler = Sampler(NvmlCollector(), clock=wall, simulated="tour")
        sampler.open()
        snaps = []
        for tick in range(seconds):
            sim_clock.t = float(tick)
            wall.t = start + tick
            snaps.append(sampler.sample())
        sampler.close()
        return snaps
    finally:
        simnvml.uninstall()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=11)
    parser.add_argument("--copies", type=int, default=5,
                        help="LiveDiagnosis instances fed in lockstep; the fastest tick counts")
    args = parser.parse_args()
    snaps = sample_history(args.minutes * 60)
    copies = [LiveDiagnosis() for _ in range(args.copies)]
    per_tick: list[float] = []
    raised: set[str] = set()
    for snap in snaps:
        best = float("inf")
        for diagnosis in copies:
            t0 = time.perf_counter_ns()
            transitions = diagnosis.update(snap)
            best = min(best, (time.perf_counter_ns() - t0) / 1e6)
        raised.update(t.finding.id for t in transitions if t.state == "raised")
        per_tick.append(best)
    minutes = [statistics.median(per_tick[m * 60:(m + 1) * 60]) for m in range(args.minutes)]
    print(f"live rules, 8 GPUs (tour), 1 s ticks, {args.minutes} min of simulated history; "
          f"findings raised: {', '.join(sorted(raised))}")
    for m, value in enumerate(minutes):
        print(f"  minute {m + 1:2d}: {value:.3f} ms per tick (median)")
    last = minutes[min(9, args.minutes - 1)]
    ratio = last / minutes[0]
    print(f"minute {min(10, args.minutes)} / minute 1: {ratio:.2f}x "
          f"(goal <= {GOAL_RATIO:.1f}x: {'met' if ratio <= GOAL_RATIO else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
