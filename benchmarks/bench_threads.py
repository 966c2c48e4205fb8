"""The live monitor's threads and what each costs: `gputop --demo tour` in tmux at 160x50 (1 s
interval), then each thread's CPU over --seconds, read from /proc/PID/task/TID/stat, named by
`py-spy dump` (Python's thread names; without py-spy, the thread ids).

Usage: python benchmarks/bench_threads.py [--seconds 30] [--warmup 12] [--scenario tour]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """Seconds of CPU (user + system) of each thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def thread_names(pid: int) -> dict[int, str]:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return {}
    dump = subprocess.run([py_spy, "dump", "--pid", str(pid), "--nonblocking"],
                          capture_output=True, text=True, timeout=60).stdout
    names = {}
    for line in dump.splitlines():
        if line.startswith("Thread ") and '"' in line:
            names[int(line.split()[1], 0)] = line.split('"')[1]
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=12.0)
    parser.add_argument("--scenario", default="tour")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("bench_threads: needs tmux", file=sys.stderr)
        return 2
    socket = f"gputop-threads-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = f"{sys.executable} -m gputop --demo {args.scenario} --interval 1"
    subprocess.run(["tmux", "-L", socket, "-f", "/dev/null", "new-session", "-d", "-s", "t",
                    "-x", "160", "-y", "50", "-c", str(REPO), command], env=env, check=True)
    try:
        pid = int(subprocess.run(["tmux", "-L", socket, "display-message", "-p", "-t", "t",
                                  "#{pane_pid}"], capture_output=True, text=True,
                                 check=True).stdout)
        time.sleep(args.warmup)
        names = thread_names(pid)
        before, started = thread_cpu(pid), time.monotonic()
        time.sleep(args.seconds)
        after, wall = thread_cpu(pid), time.monotonic() - started
        names.update({tid: name for tid, name in thread_names(pid).items() if tid not in names})
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"gputop --demo {args.scenario}, tmux 160x50, --interval 1: {len(after)} threads; "
          f"CPU over {wall:.0f} s after {args.warmup:g} s, % of one core (10 ms kernel ticks); "
          f"load average {load} ({os.cpu_count()} CPUs)")
    spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    for tid, cpu in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {100 * cpu / wall:6.2f} %  {names.get(tid, f'thread {tid}')}")
    print(f"  {100 * sum(spent.values()) / wall:6.2f} %  all threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
