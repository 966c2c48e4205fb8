"""How soon `gputop watch` raises each demo scenario's finding (the acceptance goal: within 20 s
of the start). tests/test_watch_cli.py checks that each finding raises; this prints when.

For each scenario it runs `gputop --demo SCENARIO watch --json` from the moment the command is
started (Python start-up, the demo's stand-ins and the rules' windows all count) until the line
of the expected finding arrives, then stops it with Ctrl-C. Scenarios run one after the other
(``--parallel`` runs them all at once, as the test does, which is slower on a small machine).

Usage: python benchmarks/bench_findings.py [--runs 1] [--parallel] [--scenario NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
EXPECTED = {
    "input-starved": "dataloader-stall",
    "host-sync": "host-sync",
    "throttled": "throttling",
    "memory-leak": "memory-growth",
    "pcie-bound": "pcie-bound",
    "gpu-lost": "hardware-errors",
}
GOAL_S = 20.0
TIMEOUT_S = 180.0


class Watch:
    def __init__(self, scenario: str, env: dict[str, str]) -> None:
        self.scenario = scenario
        self.want = EXPECTED[scenario]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gputop", "--demo", scenario, "watch", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
        self.raised_at: float | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            event = json.loads(line)
            if self.raised_at is None and event["id"] == self.want and event["state"] == "raised":
                self.raised_at = time.monotonic() - self.started

    def stop(self) -> None:
        tree = []
        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(True)]
        except psutil.Error:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        for proc in tree:  # whatever did not end with it
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(tree, timeout=30)
        self.reader.join(30)


def wait_all(watches: list[Watch]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if all(w.raised_at is not None or w.proc.poll() is not None for w in watches):
            return
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--parallel", action="store_true")
    parser.add_argument("--scenario", action="append", choices=list(EXPECTED))
    args = parser.parse_args()
    scenarios = args.scenario or list(EXPECTED)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    times: dict[str, list[float | None]] = {s: [] for s in scenarios}
    for run in range(args.runs):
        batches = [scenarios] if args.parallel else [[s] for s in scenarios]
        for batch in batches:
            watches = [Watch(s, env) for s in batch]
            try:
                wait_all(watches)
            finally:
                for w in watches:
                    w.stop()
            for w in watches:
                times[w.scenario].append(w.raised_at)
                shown = f"{w.raised_at:.1f} s" if w.raised_at is not None else "not raised"
                print(f"run {run + 1}: {w.scenario:14s} {w.want:17s} {shown}", flush=True)
    print(f"time from `gputop --demo S watch` to the finding, {args.runs} run(s)"
          f"{', all scenarios at once' if args.parallel else ''} ({psutil.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}; goal < {GOAL_S:.0f} s):")
    for scenario, values in times.items():
        got = [v for v in values if v is not None]
        missed = len(values) - len(got)
        summary = (f"median {statistics.median(got):5.1f} s  worst {max(got):5.1f} s"
                   if got else "never raised")
        print(f"  {scenario:14s} {EXPECTED[scenario]:17s} {summary}"
              f"{f'  ({missed} run(s) without it within {TIMEOUT_S:.0f} s)' if got and missed else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
