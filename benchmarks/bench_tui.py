"""The live monitor's own cost, in a real terminal: `gputop --demo tour --interval 1` (8
simulated GPUs) in tmux at 160x50, on a host with ~300 processes, for 60 s.

Prints gputop's own CPU use (% of one core: the median of 1 s readings and the average over the
run, from psutil on the gputop process; the demo's stand-in processes are separate processes
and not counted) and the frame times the app logs (GPUTOP_FRAME_LOG): the frame handler alone
(wall and CPU) and the whole frame until it is painted. Goal: under 3 % of a core at a 1 s interval.

Usage: python benchmarks/bench_tui.py [--seconds 60] [--size 160x50] [--processes 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def gputop_command(interval: float) -> str:
    """The installed console script when there is one, else this checkout's module."""
    if shutil.which("gputop"):
        return f"gputop --demo tour --interval {interval:g}"
    return f"{sys.executable} -m gputop --demo tour --interval {interval:g}"


def find_gputop(pane_pid: int) -> psutil.Process | None:
    try:
        pane = psutil.Process(pane_pid)
        for proc in [pane, *pane.children(recursive=True)]:
            cmd = " ".join(proc.cmdline())
            if "gputop" in cmd and "gputop.demo" not in cmd and "--demo tour" in cmd:
                return proc
    except psutil.Error:
        pass
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--size", default="160x50")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=300,
                        help="start sleeping processes until the host has this many")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds after the first frame that are not counted")
    parser.add_argument("--paused", action="store_true",
                        help="press space first: sampling goes on, drawing stops (the floor)")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("bench_tui: needs tmux", file=sys.stderr)
        return 2
    width, height = (int(x) for x in args.size.split("x"))

    fillers: list[subprocess.Popen] = []
    socket = f"gputop-bench-{uuid.uuid4().hex[:8]}"
    frame_log = Path(tempfile.mkdtemp(prefix="gputop-bench-")) / "frames.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["GPUTOP_FRAME_LOG"] = str(frame_log)

    def tmux(*targs: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *targs], env=env, capture_output=True,
                              text=True, check=True, timeout=10).stdout

    try:
        while len(psutil.pids()) < args.processes and len(fillers) < 400:
            fillers.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
        host_processes = len(psutil.pids())
        tmux("-f", "/dev/null", "new-session", "-d", "-s", "bench", "-x", str(width),
             "-y", str(height), "-c", str(REPO), gputop_command(args.interval))
        pane_pid = int(tmux("display-message", "-p", "-t", "bench", "#{pane_pid}").strip())
        deadline = time.monotonic() + 15
        proc = None
        while proc is None and time.monotonic() < deadline:
            proc = find_gputop(pane_pid)
            time.sleep(0.05)
        if proc is None:
            print("bench_tui: gputop did not start", file=sys.stderr)
            return 1
        # Start counting once the first frame is on screen and the warm-up has passed.
        while "NVIDIA" not in tmux("capture-pane", "-p", "-t", "bench"):
            if time.monotonic() > deadline:
                print("bench_tui: no GPU on screen", file=sys.stderr)
                return 1
            time.sleep(0.05)
        if args.paused:
            tmux("send-keys", "-t", "bench", "space")
        time.sleep(args.warmup)
        frames_before = len(frame_log.read_text().splitlines()) if frame_log.exists() else 0
        readings = []
        proc.cpu_percent(None)
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.monotonic()
        end = wall0 + args.seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            readings.append(proc.cpu_percent(None))
        cpu1, wall1 = sum(proc.cpu_times()[:2]), time.monotonic()
        threads = proc.num_threads()
        tmux("send-keys", "-t", "bench", "q")
        proc.wait(10)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
        for filler in fillers:
            filler.kill()
        for filler in fillers:
            filler.wait()

    lines = frame_log.read_text().splitlines()[frames_before:] if frame_log.exists() else []
    handler = [float(line.split()[0]) for line in lines]
    handler_cpu = [float(line.split()[1]) for line in lines]
    painted = [float(line.split()[2]) for line in lines]
    shutil.rmtree(frame_log.parent, ignore_errors=True)
    average = 100.0 * (cpu1 - cpu0) / (wall1 - wall0)
    print(f"gputop --demo tour (8 GPUs) --interval {args.interval:g} in tmux {width}x{height}"
          f"{' (paused: sampling only)' if args.paused else ''}; "
          f"host processes: {host_processes}; measured {wall1 - wall0:.0f} s after "
          f"{args.warmup:g} s warm-up; gputop threads: {threads}")
    print(f"gputop CPU (% of one core): median {statistics.median(readings):.2f}  "
          f"p95 {percentile(readings, 0.95):.2f}  average {average:.2f}  "
          f"(goal < 3.00 at a 1 s interval)")
    if handler:
        print(f"frames: {len(handler)}; frame handler: wall median "
              f"{statistics.median(handler):.2f} ms p95 {percentile(handler, 0.95):.2f} ms, "
              f"CPU median {statistics.median(handler_cpu):.2f} ms p95 "
              f"{percentile(handler_cpu, 0.95):.2f} ms; until painted (wall): median "
              f"{statistics.median(painted):.2f} ms p95 {percentile(painted, 0.95):.2f} ms")
        print("(wall times include waiting for a core: the demo's stand-ins keep both cores "
              "of a small machine busy)")
    else:
        print("frames: none logged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
