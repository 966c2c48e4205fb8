"""How fast the live monitor starts and quits in a real terminal: `gputop --demo tour` in tmux,
typed at a shell prompt the way a person would (the tests wait for the same screens without
timing them; this prints the times).

For each run it measures, from the moment the command line is sent to the pane:
- first screen: until the monitor is on screen (both GPU models, a utilization figure, the
  process table with a DataLoader worker row), the acceptance goal is under 3 s;
and from the moment `q` is pressed:
- quit: until the gputop process has ended (goal under 1 s);
- shell back: until the shell prints `exit=0` after it;
- stand-ins gone: until the demo's stand-in processes have all ended.

Prints the median and the worst of ``--runs`` runs. Compare runs on the same machine only; on a
machine busy with other work, expect the worst case to grow.

Usage: python benchmarks/bench_startup.py [--runs 5] [--size 120x40] [--scenario tour]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120.0


def shows_monitor(screen: str) -> bool:
    """The same screen the terminal tests wait for (tests/test_tui_terminal.py)."""
    return (
        "NVIDIA A100-SXM4-80GB" in screen
        and "NVIDIA H100 80GB HBM3" in screen
        and re.search(r"\b\d{1,3}%", screen) is not None
        and "PID" in screen
        and re.search(r"[├└]─ demo-loader", screen) is not None
    )


class Pane:
    def __init__(self, width: int, height: int, env: dict[str, str]) -> None:
        self.socket = f"gputop-bench-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "b", "-x", str(width),
                  "-y", str(height), "-c", str(REPO), "bash --norc --noprofile")
        self.shell = int(self.tmux("display-message", "-p", "-t", "b", "#{pane_pid}").strip())

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, check=True,
                              capture_output=True, text=True, timeout=TIMEOUT_S).stdout

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", "b", "-l", line)
        self.tmux("send-keys", "-t", "b", "Enter")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "b")

    def gputop(self) -> psutil.Process | None:
        try:
            for child in psutil.Process(self.shell).children():
                if "gputop" in " ".join(child.cmdline()):
                    return child
        except psutil.Error:
            pass
        return None

    def processes(self) -> list[psutil.Process]:
        try:
            server = psutil.Process(self.shell).parent()
            return [server, *server.children(recursive=True)] if server else []
        except psutil.Error:
            return []

    def close(self) -> None:
        left = self.processes()
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=TIMEOUT_S)
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=30)


def until(condition, what: str, interval: float = 0.01):
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {TIMEOUT_S:.0f} s")
        time.sleep(interval)


def alive(procs: list[psutil.Process]) -> bool:
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            pass
    return False


def one_run(width: int, height: int, scenario: str, env: dict[str, str]) -> dict[str, float]:
    pane = Pane(width, height, env)
    try:
        pane.type("PS1='$ '")
        sent = time.monotonic()
        pane.type(f"{sys.executable} -m gputop --demo {scenario}; echo exit=$?")
        proc = until(pane.gputop, "gputop process")
        until(lambda: shows_monitor(pane.screen()), "first screen")
        first = time.monotonic() - sent
        standins = proc.children(recursive=True)
        pane.tmux("send-keys", "-t", "b", "q")
        pressed = time.monotonic()
        proc.wait(TIMEOUT_S)
        quit_s = time.monotonic() - pressed
        until(lambda: "exit=0" in pane.screen(), "shell prompt")
        shell_s = time.monotonic() - pressed
        until(lambda: not alive(standins), "stand-ins gone")
        gone_s = time.monotonic() - pressed
        return {"first screen": first, "quit": quit_s, "shell back": shell_s,
                "stand-ins gone": gone_s}
    finally:
        pane.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", default="120x40")
    parser.add_argument("--scenario", default="tour",
                        help="demo scenario (the first-screen check expects tour's GPUs)")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("bench_startup: needs tmux", file=sys.stderr)
        return 2
    width, height = (int(x) for x in args.size.split("x"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    runs = []
    for i in range(args.runs):
        result = one_run(width, height, args.scenario, env)
        runs.append(result)
        print(f"run {i + 1}: " + "  ".join(f"{k} {v:.2f} s" for k, v in result.items()),
              flush=True)
    load = os.getloadavg()[0]
    print(f"gputop --demo {args.scenario} in tmux {width}x{height}, {args.runs} runs "
          f"({psutil.cpu_count()} cores, load {load:.2f}):")
    goals = {"first screen": 3.0, "quit": 1.0}
    for key in runs[0]:
        values = [r[key] for r in runs]
        goal = f"  (goal < {goals[key]:.1f} s)" if key in goals else ""
        print(f"  {key:15s} median {statistics.median(values):6.2f} s  "
              f"worst {max(values):6.2f} s{goal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
