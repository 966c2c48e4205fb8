"""The fleet screen with 32 nodes at a 1 s interval: its own CPU, and the time from a finding
leaving a node to its appearance on the fleet screen.

Each node is a real sshd on 127.0.0.2-33 (Debian's openssh-server, throwaway keys, as in the
tests) whose "gputop" is benchmarks/fleet_standin.py: it replays a real recording of
`gputop --demo tour stream` (8 GPUs each, so 256 GPU rows) with fresh times, and at a scheduled
moment adds a new finding, noting when its line went out. `--transport local` replaces ssh and
sshd by a local stand-in of ssh that runs the same stream directly (no encryption, no sshd).

`gputop --hosts node-01,...` runs in tmux (--size, default 160x50). Measured, after all nodes
are up and a warm-up: the CPU of the fleet process itself (psutil on its pid: the median of
1 s readings and the average; the ssh clients are separate processes, reported apart), and for
each scheduled finding: line written on the node -> drawn by the fleet app (its log, after the
screen refresh) and -> seen in the terminal (tmux capture-pane polled every 50 ms).

Usage: python benchmarks/bench_fleet.py [--nodes 32] [--seconds 60] [--transport sshd|local]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
from harness import percentile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STANDIN = REPO / "benchmarks" / "fleet_standin.py"
FAKE_SSH = """#!/bin/sh
# A local stand-in for ssh: the node name is the next-to-last argument, its command the last.
for last; do :; done
host=""
prev=""
for arg; do
    if [ "$arg" = "$last" ]; then host="$prev"; fi
    prev="$arg"
done
GPUTOP_NODE_SCENARIO="$host" exec sh -c "$last"
"""


def record_tour(path: Path, seconds: float) -> None:
    """A real `gputop --demo tour stream`, long enough for its findings to raise."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "gputop", "--demo", "tour", "--interval", "1",
                           "stream", "--duration", str(seconds)], capture_output=True,
                          env=env, timeout=seconds + 120, cwd=REPO)
    lines = done.stdout.decode().splitlines()
    if done.returncode != 0 or len(lines) < 5:
        raise SystemExit(f"bench_fleet: recording the tour failed: {done.stderr.decode()[-300:]}")
    # The hello and the last samples, once the tour's findings are up.
    keep = [lines[0], *lines[-min(10, len(lines) - 1):]]
    path.write_text("\n".join(keep) + "\n")
    findings = len(json.loads(keep[-1])["findings"])
    print(f"recorded `gputop --demo tour stream`: {len(keep) - 1} samples replayed in a loop, "
          f"{len(json.loads(keep[-1])['snapshot']['gpus'])} GPUs and {findings} findings each, "
          f"{len(keep[-1])} bytes a line")


def find_fleet(pane_pid: int) -> psutil.Process | None:
    try:
        pane = psutil.Process(pane_pid)
        for proc in [pane, *pane.children(recursive=True)]:
            cmd = " ".join(proc.cmdline())
            if "gputop" in cmd and "--hosts" in cmd and proc.name() != "ssh":
                return proc
    except psutil.Error:
        pass
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--size", default="160x50")
    parser.add_argument("--transport", choices=("sshd", "local"), default="sshd")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("bench_fleet: needs tmux", file=sys.stderr)
        return 2
    width, height = (int(x) for x in args.size.split("x"))
    work = Path(tempfile.mkdtemp(prefix="gputop-bench-fleet-"))
    names = [f"node-{i + 1:02d}" for i in range(args.nodes)]
    lines_file, schedule_file = work / "tour.jsonl", work / "schedule.json"
    raise_log, draw_log = work / "raised.log", work / "drawn.log"
    record_tour(lines_file, 30.0)
    standin = (f"{sys.executable} {STANDIN} --lines {lines_file} --schedule {schedule_file} "
               f"--log {raise_log}")
    env = dict(os.environ, PYTHONPATH=str(REPO), GPUTOP_FLEET_LOG=str(draw_log))
    cluster = None
    if args.transport == "sshd":
        from tests.sshd_kit import Cluster, sshd_missing

        why = sshd_missing()
        if why:
            print(f"bench_fleet: {why} (or use --transport local)", file=sys.stderr)
            return 2
        cluster = Cluster(work / "nodes", {n: n for n in names}).start()
        fleet_args = f"--ssh-config {cluster.ssh_config}"
    else:
        bindir = work / "bin"
        bindir.mkdir()
        (bindir / "ssh").write_text(FAKE_SSH)
        (bindir / "ssh").chmod(0o755)
        env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
        fleet_args = ""
    # Each node raises its finding at its own moment, within the measured window (scheduled
    # once every node is up).
    schedule_file.write_text("{}")
    socket = f"gputop-bench-{uuid.uuid4().hex[:8]}"

    def tmux(*targs: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *targs], env=env, capture_output=True,
                              text=True, check=True, timeout=10).stdout

    command = (f"{sys.executable} -m gputop --interval 1 --hosts {','.join(names)} {fleet_args} "
               f"--remote-gputop '{standin}'")
    seen_on_screen: dict[str, float] = {}
    stop_polling = threading.Event()
    try:
        tmux("-f", "/dev/null", "new-session", "-d", "-s", "bench", "-x", str(width),
             "-y", str(height), "-c", str(REPO), command)
        pane_pid = int(tmux("display-message", "-p", "-t", "bench", "#{pane_pid}").strip())
        deadline = time.monotonic() + 120
        fleet = None
        while fleet is None and time.monotonic() < deadline:
            fleet = find_fleet(pane_pid)
            time.sleep(0.1)
        if fleet is None:
            print("bench_fleet: the fleet screen did not start", file=sys.stderr)
            return 1
        started = time.monotonic()
        while f"{args.nodes} nodes: {args.nodes} up" not in tmux("capture-pane", "-p", "-t",
                                                                 "bench"):
            if time.monotonic() > deadline:
                print("bench_fleet: not every node came up:\n"
                      + tmux("capture-pane", "-p", "-t", "bench"), file=sys.stderr)
                return 1
            time.sleep(0.2)
        all_up = time.monotonic() - started
        time.sleep(args.warmup)
        now = time.time()
        spacing = max(0.5, (args.seconds - 10) / args.nodes)
        schedule = {n: {"time": now + 5 + i * spacing + 0.37 * (i % 3), "rank": i}
                    for i, n in enumerate(names)}
        # The stand-ins look at the file again when it changes.
        tmp = schedule_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(schedule))
        tmp.replace(schedule_file)

        def poll() -> None:
            while not stop_polling.is_set():
                try:
                    screen = tmux("capture-pane", "-p", "-t", "bench")
                except subprocess.SubprocessError:
                    continue
                t = time.time()
                for n in names:
                    if n not in seen_on_screen and f"bench raise on {n}" in screen:
                        seen_on_screen[n] = t
                time.sleep(0.05)

        readings: list[float] = []
        fleet.cpu_percent(None)
        cpu0, wall0 = sum(fleet.cpu_times()[:2]), time.monotonic()
        ssh_procs = [p for p in fleet.children() if p.name() in ("ssh", "sh")]
        ssh0 = sum(sum(p.cpu_times()[:2]) for p in ssh_procs if p.is_running())
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        end = wall0 + args.seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            readings.append(fleet.cpu_percent(None))
        cpu1, wall1 = sum(fleet.cpu_times()[:2]), time.monotonic()
        ssh1 = sum(sum(p.cpu_times()[:2]) for p in ssh_procs if p.is_running())
        threads = fleet.num_threads()
        rss = fleet.memory_info().rss
        stop_polling.set()
        poller.join(5)
        tmux("send-keys", "-t", "bench", "q")
        fleet.wait(30)
    finally:
        stop_polling.set()
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
        if cluster is not None:
            cluster.stop()

    raised = {}
    for line in raise_log.read_text().splitlines() if raise_log.exists() else []:
        t, node = line.split()
        raised.setdefault(node, float(t))
    drawn = {}
    for line in draw_log.read_text().splitlines() if draw_log.exists() else []:
        t, node, fid, _gpu = line.split()
        if fid == "hung":
            drawn.setdefault(node, float(t))
    to_app = [drawn[n] - raised[n] for n in raised if n in drawn]
    to_term = [seen_on_screen[n] - raised[n] for n in raised if n in seen_on_screen]
    average = 100.0 * (cpu1 - cpu0) / (wall1 - wall0)
    shutil.rmtree(work, ignore_errors=True)
    print(f"gputop fleet: {args.nodes} nodes x 8 GPUs ({args.nodes * 8} GPU rows) at 1 s over "
          f"{args.transport} in tmux {width}x{height}; all nodes up {all_up:.1f} s after "
          f"start; measured {wall1 - wall0:.0f} s after {args.warmup:g} s warm-up; "
          f"{threads} threads, RSS {rss / 2**20:.0f} MiB")
    print(f"fleet process CPU (% of one core): median {statistics.median(readings):.1f}  "
          f"p95 {percentile(readings, 0.95):.1f}  average {average:.1f}")
    print(f"ssh clients, together: {100.0 * (ssh1 - ssh0) / (wall1 - wall0):.1f} % of one core "
          f"({len(ssh_procs)} processes)")
    for label, values in (("drawn by the fleet app", to_app),
                          ("seen in the terminal (tmux, 50 ms polling)", to_term)):
        if values:
            print(f"finding written on a node -> {label}: median "
                  f"{statistics.median(values) * 1000:.0f} ms  p95 "
                  f"{percentile(values, 0.95) * 1000:.0f} ms  max {max(values) * 1000:.0f} ms "
                  f"({len(values)} of {len(raised)} findings)")
        else:
            print(f"finding written on a node -> {label}: none measured")
    print("(the node's own live rules add their 4 s hysteresis before a finding is written; "
          "this is the path from the node's stdout to the screen)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
