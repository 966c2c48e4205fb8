"""What agents cost the monitor's tick: the status probe, with and without silent sockets.

    python benchmarks/bench_agent_probe.py [--agents 4] [--silent 20] [--ticks 10]

Starts ``--agents`` real agents (plain Python processes that call ``gputop.agent.install()``)
and, in a second phase, ``--silent`` sockets that accept and never answer (another user's when
run as root, as tests/scripts/silent_sockets.py makes them; else our own). For each phase it
times one tick of:

- the old probe: every agent's ``status`` one after another, 0.5 s timeout each
  (``client.agent_status`` over ``client.list_agents``);
- ``StatusProbe``: all at once within one deadline (``PROBE_DEADLINE_S``), quiet sockets
  remembered: its first tick, and the median of the ticks after it.

It prints the times and the ratio old/new, and checks that every real agent answered.
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

from gputop.client import agents as client  # noqa: E402
from gputop.client.status_probe import PROBE_DEADLINE_S, StatusProbe  # noqa: E402

AGENT = ("import gputop.agent, sys, time; gputop.agent.install(); print('up', flush=True); "
         "time.sleep(3600)")


def old_probe() -> dict[int, dict]:
    statuses = {}
    for pid in client.list_agents():
        status = client.agent_status(pid)
        if status is not None:
            statuses[pid] = status
    return statuses


def timed(fn) -> tuple[float, dict]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def phase(name: str, agents: set[int], ticks: int) -> None:
    old_s, old = timed(old_probe)
    probe = StatusProbe()
    first_s, first = timed(lambda: probe(set()))
    rest = [timed(lambda: probe(set())) for _ in range(ticks)]
    steady = statistics.median(t for t, _ in rest)
    missing = agents - set(first) or agents - set(rest[-1][1])
    print(f"{name}:")
    print(f"  old probe, one tick            {old_s * 1000:8.1f} ms  "
          f"({len(set(old) & agents)}/{len(agents)} agents answered)")
    print(f"  StatusProbe, first tick        {first_s * 1000:8.1f} ms  "
          f"({len(set(first) & agents)}/{len(agents)})")
    print(f"  StatusProbe, later ticks (p50) {steady * 1000:8.1f} ms  "
          f"({len(set(rest[-1][1]) & agents)}/{len(agents)})")
    print(f"  ratio old / new: first tick {old_s / first_s:.1f}x, later {old_s / steady:.1f}x; "
          f"bound per tick {PROBE_DEADLINE_S * 1000:.0f} ms")
    if missing:
        print(f"  WARNING: agents that did not answer: {sorted(missing)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--silent", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=10)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    holder = None
    silent: list[int] = []
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    try:
        for _ in range(args.agents):
            proc = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE,
                                    text=True, env=env)
            procs.append(proc)
            assert proc.stdout.readline().strip() == "up"
        agents = {p.pid for p in procs}
        phase(f"{args.agents} agents", agents, args.ticks)
        holder = subprocess.Popen([sys.executable, str(REPO / "tests" / "scripts" /
                                                        "silent_sockets.py"), "--uid", str(uid),
                                   "--count", str(args.silent)], stdout=subprocess.PIPE,
                                  text=True, env=env, cwd="/")
        silent = [int(p) for p in holder.stdout.readline().split()[1:]]
        phase(f"{args.agents} agents + {len(silent)} silent sockets of uid {uid}", agents,
              args.ticks)
    finally:
        for proc in [*procs, *([holder] if holder else [])]:
            proc.kill()
            proc.wait()
        if holder is not None:
            for pid in silent:
                try:
                    os.unlink(f"/tmp/gputop-{uid}/{pid}.sock")
                except OSError:
                    pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
