"""Hangs, live: how soon the finding comes, how long `h` / `gputop hang` takes, and what Flight
Recorder costs a job.

1. The time from the hang to the finding: a 4-rank gloo job (tests/scripts/hang_train.py under
   `gputop run -- torchrun`) whose rank 2 sleeps before an all_reduce, beside `gputop watch
   --json`; from the moment rank 2 says it stops (its "at N" line) to the watch's `hang` line.
   The bound's floor is --min-s (GPUTOP_HANG_MIN_S; 60 s by default in the product).
2. The time from `h` (what it runs: ``collect`` + ``join``, as `gputop hang PID` does) to the
   attribution, for 4 and 16 ranks (gloo on CPU), once their job hangs.
3. Flight Recorder's cost: the step time (the agent's p50) of a job with 8 all_reduce calls per
   step and no sleep, with TORCH_FR_BUFFER_SIZE=2000 and with it 0, alternated --rounds times.

Usage: python benchmarks/bench_hang.py [--min-s 5] [--big 16] [--rounds 2]
       [--only finding|attribution|fr]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputop.capture.hang import HangError, collect, find_ranks  # noqa: E402
from gputop.capture.hang_report import join  # noqa: E402
from gputop.client.agents import agent_status  # noqa: E402
from tests.conftest import end_popen  # noqa: E402
from tests.scripts.agent_testkit import gputop_run, private_agent_world  # noqa: E402

SCRIPT = REPO / "tests" / "scripts" / "hang_train.py"


def start(env: dict, ranks: int, *args: str) -> subprocess.Popen:
    return gputop_run(["torchrun", "--nproc-per-node", str(ranks), str(SCRIPT), *args], env)


def lines_of(proc: subprocess.Popen, seen: dict[str, float]) -> threading.Thread:
    """Note the time each line of the job's stdout arrives."""

    def read() -> None:
        for line in proc.stdout:
            seen.setdefault(line.strip(), time.monotonic())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"gave up waiting for {what}")


def ranks_up(pid: int, count: int) -> bool:
    try:
        return len(find_ranks(str(pid))[2]) == count
    except HangError:
        return False


def time_to_finding(env: dict) -> float:
    seen: dict[str, float] = {}
    job = start(env, 4, "--scenario", "sleep", "--rank", "2", "--at", "40")
    watch = subprocess.Popen([sys.executable, "-m", "gputop", "watch", "--json", "--no-where"],
                             env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        lines_of(job, seen)
        raised: dict[str, float] = {}

        def read_watch() -> None:
            for line in watch.stdout:
                if line.startswith("{"):
                    item = json.loads(line)
                    if item.get("id") == "hang" and item.get("state") == "raised":
                        raised.setdefault("hang", time.monotonic())

        threading.Thread(target=read_watch, daemon=True).start()
        hung = wait(lambda: seen.get("rank 2 at 40"), 600, "rank 2 to stop")
        found = wait(lambda: raised.get("hang"), 600, "the hang finding")
        return found - hung
    finally:
        end_popen(watch)
        end_popen(job)


def time_to_attribution(env: dict, ranks: int) -> tuple[float, str]:
    seen: dict[str, float] = {}
    job = start(env, ranks, "--scenario", "sleep", "--rank", "2", "--at", "20")
    try:
        lines_of(job, seen)
        wait(lambda: seen.get("rank 2 at 20"), 900, f"the {ranks}-rank job to hang")
        wait(lambda: ranks_up(job.pid, ranks), 120, "every rank")
        time.sleep(2)  # the others are inside the all_reduce
        t0 = time.perf_counter()
        live = join(collect(str(job.pid)))
        took = time.perf_counter() - t0
        primary = live.report.primary
        return took, primary.title if primary is not None else live.report.verdict
    finally:
        end_popen(job)


def step_time(env: dict, fr: bool) -> float:
    job = start({**env, "TORCH_FR_BUFFER_SIZE": "2000" if fr else "0"}, 4, "--collectives", "8",
                "--step-ms", "0")
    try:
        seen: dict[str, float] = {}
        lines_of(job, seen)
        wait(lambda: ranks_up(job.pid, 4), 600, "the job")
        pids = [c.pid for c in find_ranks(str(job.pid))[2]]
        wait(lambda: ((agent_status(pids[0], timeout=2) or {}).get("steps") or 0) >= 300, 600,
             "300 steps")
        p50s = [(agent_status(p, timeout=2) or {}).get("step_time_p50_s") for p in pids]
        return statistics.median(p for p in p50s if p)
    finally:
        end_popen(job)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-s", type=float, default=5.0, help="GPUTOP_HANG_MIN_S (floor)")
    parser.add_argument("--big", type=int, default=16, help="ranks of the large job")
    parser.add_argument("--rounds", type=int, default=2, help="FR on/off pairs")
    parser.add_argument("--only", choices=("finding", "attribution", "fr"),
                        help="measure this one figure only")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gputop-bench-hang-"))
    with private_agent_world(work / "captures", OMP_NUM_THREADS="1",
                             GPUTOP_HANG_MIN_S=str(args.min_s)) as (env, _):
        if args.only in (None, "finding"):
            detect = time_to_finding(env)
            print(f"hang -> finding: {detect:.1f} s (bound floor {args.min_s:.0f} s, + the "
                  "monitor's 4 s hysteresis and its 1 s ticks)")
        for ranks in (4, args.big) if args.only in (None, "attribution") else ():
            took, title = time_to_attribution(env, ranks)
            print(f"h / gputop hang, {ranks} ranks: attribution in {took:.2f} s: {title}")
        if args.only not in (None, "fr"):
            return 0
        on, off = [], []
        for _ in range(args.rounds):
            on.append(step_time(env, True))
            off.append(step_time(env, False))
        print("  per round (on, off) ms: " + ", ".join(
            f"({a * 1e3:.2f}, {b * 1e3:.2f})" for a, b in zip(on, off)))
        ratio = statistics.median(on) / statistics.median(off)
        print(f"Flight Recorder cost, 8 all_reduce per step, 4 gloo ranks: step p50 "
              f"{statistics.median(on) * 1e3:.2f} ms on / {statistics.median(off) * 1e3:.2f} ms "
              f"off = ratio {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
