"""One-shot cost: `gputop --demo tour snapshot` against `nvitop -1` on the same simulated NVML.

The tour's stand-in processes are started once here and handed to both (GPUTOP_DEMO_PIDS), so
neither starts processes of its own; nvitop runs in benchmarks/nvitop_simulated.py (the
simulated library behind nvidia-ml-py). Each command runs --runs times, alternating; the CPU
time (user + system) of each run's process and its children, from wait4's rusage, and its
wall time are printed as min / median / max, with the gputop/nvitop ratio (goal: CPU <= 1.00).

Usage: python benchmarks/bench_snapshot.py [--runs 7] [--scenario tour]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import spread as harness_spread  # noqa: E402

from gputop.demo.standins import StandIns, wait_ready  # noqa: E402
from gputop.sim.scenarios import SCENARIOS  # noqa: E402


def spread(values: list[float]) -> str:
    return harness_spread(values, "{:.3f}")


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds of the process and its children, wall seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(f"bench_snapshot: {' '.join(command)} failed: {err[-500:]}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--scenario", default="tour")
    args = parser.parse_args()
    py = sys.executable
    # Both warm: their modules compiled once before the timed runs.
    subprocess.run([py, "-m", "compileall", "-q", str(REPO / "gputop")], capture_output=True,
                   check=False)
    commands = {"gputop": [py, "-m", "gputop", "--demo", args.scenario, "snapshot"],
                "nvitop": [py, str(REPO / "benchmarks" / "nvitop_simulated.py"), args.scenario,
                           "-1"]}
    cpu: dict[str, list[float]] = {n: [] for n in commands}
    wall: dict[str, list[float]] = {n: [] for n in commands}
    with StandIns(SCENARIOS[args.scenario]) as standins:
        pids_by_gpu = standins.start()
        wait_ready(standins, timeout=60)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["GPUTOP_DEMO_PIDS"] = ",".join(f"{i}:{p}" for i, ps in pids_by_gpu.items()
                                           for p in ps)
        for command in commands.values():  # a first, untimed run of each
            timed(command, env)
        for run in range(args.runs):
            for name in (("gputop", "nvitop") if run % 2 == 0 else ("nvitop", "gputop")):
                c, w = timed(commands[name], env)
                cpu[name].append(c)
                wall[name].append(w)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.scenario}: {len(SCENARIOS[args.scenario].gpus)} simulated GPUs, {args.runs} "
          f"runs each, alternating; load average {load} ({os.cpu_count()} CPUs)")
    for name in commands:
        print(f"  {name}: CPU {spread(cpu[name])} s, wall {spread(wall[name])} s "
              f"(min / median / max)")
    ratios = sorted(a / b for a, b in zip(cpu["gputop"], cpu["nvitop"]))
    print(f"gputop snapshot / nvitop -1, CPU per run pair: {spread(ratios)} (goal, median: "
          f"<= 1.00: {'met' if statistics.median(ratios) <= 1.0 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
