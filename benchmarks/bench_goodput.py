"""How exactly the agent's goodput ledger books a job's time: the figures that
tests/test_efficiency.py::test_goodput_books_waits_checkpoints_file_writes_and_stalls no longer
asserts (on a busy machine wall-clock seconds are not the ledger's to guarantee).

The job (tests/scripts/flops_train.py under `gputop run`) waits on its DataLoader every step,
calls torch.save every 40 steps, writes and fsyncs 16 MiB every 50, and sleeps 0.6 s every 60
(step 120 saves and stalls). Once it is past step --steps, this prints each category's booked
seconds, the stall seconds against the sleeps the job made, and whether the categories plus
the time inside the current step add up to the wall time.

Usage: python benchmarks/bench_goodput.py [--steps 130]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputop.client.agents import agent_status  # noqa: E402
from tests.scripts.agent_testkit import gputop_run, private_agent_world  # noqa: E402

SCRIPT = REPO / "tests" / "scripts" / "flops_train.py"
STALL_EVERY, STALL_S = 60, 0.6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=130, help="read the ledger past this step")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gputop-bench-goodput-"))
    with private_agent_world(work / "captures", OMP_NUM_THREADS="1") as (env, _):
        proc = gputop_run([sys.executable, str(SCRIPT), "--dims", "64,256,128,10", "--batch",
                           "32", "--step-sleep", "0.01", "--loader-sleep", "0.004",
                           "--save-every", "40", "--write-every", "50", "--stall-every",
                           str(STALL_EVERY), "--stall-s", str(STALL_S), "--out", str(work)], env)
        try:
            pid = json.loads(proc.stdout.readline())["pid"]
            deadline = time.monotonic() + 600
            status = None
            while time.monotonic() < deadline:
                status = agent_status(pid, timeout=1.0)
                if status and status["steps"] >= args.steps and status.get("goodput"):
                    break
                time.sleep(0.5)
        finally:
            proc.kill()
            proc.wait(30)
    if not status or not status.get("goodput"):
        print("the job did not reach the step in 600 s")
        return 1
    ledger = status["goodput"]
    seconds = ledger["seconds"]
    slept = STALL_S * (status["steps"] // STALL_EVERY)
    total = sum(seconds.values())
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; ledger at step "
          f"{status['steps']}, wall {ledger['wall_s']:.2f} s")
    for name, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<12} {value:8.3f} s  {value / total:6.1%}")
    print(f"stall booked {seconds.get('stall', 0):.3f} s against {slept:.1f} s slept "
          f"(x{seconds.get('stall', 0) / slept:.2f})")
    print(f"checkpoint booked {seconds.get('checkpoint', 0) * 1e3:.1f} ms (3 torch.save, "
          f"2 files of 16 MiB fsynced)")
    print(f"categories + in-step {total + ledger['in_step_s']:.3f} s against wall "
          f"{ledger['wall_s']:.3f} s; goodput {ledger['goodput']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
