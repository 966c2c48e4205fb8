"""gputop's live monitor against nvitop's on one real GPU, side by side, in one short run.

The same comparison as benchmarks/bench_tui.py, made to fit a lent GPU machine (no tmux
needed, total under 150 s with the defaults): each monitor runs in its own pseudo-terminal of
--size (160x50), at a 1 s interval, while a small CUDA job (torch matrix products, about half
busy) holds the GPU so both show one GPU process. For each of --runs runs:

- first frame: from the monitor's start to the first screen that shows the job's pid (the
  two start one after the other, alternating who goes first; the other one is not running yet);
- CPU: both running at the same time, --seconds after --warmup, each one's own process
  (threads included), as % of one core;
- RSS and threads at the end of that window;
- beside them, Textual's floor: a minimal Textual app that only redraws a screenful of text
  each interval, measured the same way (--no-floor leaves it out).

It prints each run, then min / median / max of each figure and of the per-run ratios
gputop/nvitop (goals, median: CPU <= 1.00, RSS <= 1.5, first frame <= 1.2), with the
machine's CPU count and load average (other work slows both alike: compare ratios).

--simulated: a dry run for any machine without a GPU, against gputop's simulated NVML
(`--demo SCENARIO` for gputop, benchmarks/nvitop_simulated.py for nvitop; the scenario's
stand-in processes instead of the CUDA job). Same code path otherwise.

On the lent GPU machine (see benchmarks/gpu/python_env.sh for the wheels in .whl/):

    . benchmarks/gpu/python_env.sh && $py benchmarks/gpu/monitor_cost.py

Here:  python benchmarks/gpu/monitor_cost.py --simulated
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
FIRST_FRAME_TIMEOUT_S = 45.0
JOB_READY_TIMEOUT_S = 60.0
NAMES = ("gputop", "nvitop")
# Textual's floor: a minimal Textual app that redraws a screenful of text once per interval
# (one Static widget) and reads nothing. Run beside the two (not in the ratios' goals): what
# any monitor built on Textual costs at the least, measured in the same run.
FLOOR = """
import sys
from textual.app import App
from textual.widgets import Static
interval, rows, cols = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
class Floor(App):
    n = 0
    def compose(self):
        yield Static(id="s")
    def on_mount(self):
        self.draw()
        self.set_interval(interval, self.draw)
    def draw(self):
        self.n += 1
        self.query_one(Static).update("\\n".join(
            f"FLOOR-DRAWN {self.n:6d} row {i:3d} ".ljust(cols - 1, ".") for i in range(rows - 1)))
Floor().run()
"""
# Escape sequences (CSI, OSC, DCS/APC strings, charset picks, two-byte escapes), removed from a
# monitor's output before looking for text: what is left is what a terminal would print.
ESCAPES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]P_^][^\x07\x1b]*(?:\x07|\x1b\\)?"
                     rb"|\x1b[()*+][0-9A-Za-z]|\x1b[@-Z\\-_=>78]")

# The CUDA job: matrix products for ~20 ms, then ~20 ms asleep, until killed.
JOB = """
import sys, time, torch
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
y = x @ x
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    t = time.monotonic() + 0.02
    while time.monotonic() < t:
        y = x @ x
        torch.cuda.synchronize()
    time.sleep(0.02)
"""


class Monitor:
    """One monitor in its own pseudo-terminal (its controlling terminal, of the given size);
    a thread drains what it writes (a full pty would stall it) and notes when the wanted
    text first shows."""

    def __init__(self, name: str, command: list[str], width: int, height: int,
                 env: dict[str, str], want: re.Pattern[bytes]) -> None:
        self.name = name
        self.want = want
        self.shown = threading.Event()
        self.shown_at = 0.0
        self.tail = b""
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        self.master = master
        self.stopped = False
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            command, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # noqa: PLW1509
        os.close(slave)
        self.ps = psutil.Process(self.proc.pid)
        self.reader = threading.Thread(target=self._drain, name=f"{name}-pty", daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        raw = b""
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the monitor ended and closed the terminal
                return
            if not chunk:
                return
            if self.shown.is_set():
                continue
            raw = (raw + chunk)[-262144:]
            text = ESCAPES.sub(b"", raw)
            self.tail = text[-4000:]
            if self.want.search(text):
                self.shown_at = time.monotonic()
                self.shown.set()

    def first_frame(self) -> float:
        if not self.shown.wait(FIRST_FRAME_TIMEOUT_S):
            self.stop()
            raise SystemExit(f"monitor_cost: {self.name} showed no first frame in "
                             f"{FIRST_FRAME_TIMEOUT_S:g} s (exit {self.proc.poll()}); its "
                             f"last text: {self.tail[-1500:].decode(errors='replace')!r}")
        return self.shown_at - self.started

    def cpu(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        self.reader.join(2)
        os.close(self.master)


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """min / median / max."""
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values),
                                              max(values)))


def machine_line(simulated: bool) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    gpu = "gputop's simulated NVML"
    if not simulated:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=20).stdout.strip()
            gpu = out.splitlines()[0] if out else "nvidia-smi gave nothing"
        except (OSError, subprocess.TimeoutExpired) as exc:
            gpu = f"nvidia-smi failed: {exc}"
    return (f"machine: {os.cpu_count()} CPUs, load average {load}, "
            f"{len(psutil.pids())} processes; GPU: {gpu}; Python {sys.version.split()[0]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simulated", action="store_true",
                        help="dry run on the simulated NVML (no GPU needed)")
    parser.add_argument("--scenario", default="host-sync",
                        help="with --simulated: the demo scenario (default: host-sync, 1 GPU)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=25.0,
                        help="CPU window of each run, both monitors running")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds after both first frames that are not counted")
    parser.add_argument("--size", default="160x50")
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="leave out the minimal Textual app (Textual's floor)")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    began = time.monotonic()
    py = sys.executable
    env = dict(os.environ, TERM="xterm-256color", PYTHONUNBUFFERED="1")
    env.pop("COLORTERM", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(REPO)]))
    interval = ["--interval", f"{args.interval:g}"]
    job: subprocess.Popen | None = None
    standins = None
    try:
        if args.simulated:
            sys.path.insert(0, str(REPO))
            try:
                from gputop.sim.scenarios import SCENARIOS
            except ImportError:  # before issue 35's moves
                from gputop.collect.scenarios import SCENARIOS
            from gputop.demo.standins import StandIns, wait_ready
            if args.scenario not in SCENARIOS:
                parser.error(f"--scenario: one of {', '.join(SCENARIOS)}")
            standins = StandIns(SCENARIOS[args.scenario])
            pids_by_gpu = standins.start()
            wait_ready(standins, timeout=JOB_READY_TIMEOUT_S)
            pids = [p for ps in pids_by_gpu.values() for p in ps]
            env["GPUTOP_DEMO_PIDS"] = ",".join(f"{i}:{p}" for i, ps in pids_by_gpu.items()
                                               for p in ps)
            commands = {
                "gputop": [py, "-m", "gputop", "--demo", args.scenario, *interval],
                "nvitop": [py, str(REPO / "benchmarks" / "nvitop_simulated.py"),
                           args.scenario, *interval],
            }
        else:
            job = subprocess.Popen([py, "-c", JOB], stdout=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            # torch's import and CUDA's start take seconds: wait for its line, not forever.
            seen, _, _ = select.select([job.stdout], [], [], JOB_READY_TIMEOUT_S)
            ready = job.stdout.readline() if seen and job.stdout else b""
            if not ready.startswith(b"ready"):
                try:
                    code = job.wait(5)
                except subprocess.TimeoutExpired:
                    code = None
                raise SystemExit(f"monitor_cost: the CUDA job did not start (exit {code}; "
                                 f"waited at most {JOB_READY_TIMEOUT_S:g} s)")
            pids = [job.pid]
            commands = {"gputop": [py, "-m", "gputop", *interval],
                        "nvitop": [py, "-m", "nvitop", *interval]}
        # A warm start for both, as after a first run: their modules compiled once here (the
        # GPU machine's wheels are installed with --no-compile, and a fresh checkout has no
        # .pyc: the first start would otherwise compile Textual, nvitop and gputop).
        subprocess.run([py, "-m", "compileall", "-q", str(REPO / "gputop")],
                       capture_output=True, env=env, check=False)
        subprocess.run([py, "-c", "import textual.app, textual.widgets, nvitop.cli, "
                        "gputop.tui.monitor.app"], capture_output=True, env=env, cwd=REPO, check=False)
        want = re.compile(rb"(?<![0-9])(?:" + b"|".join(str(p).encode() for p in pids)
                          + rb")(?![0-9])")
        print(machine_line(args.simulated))
        print(f"{'simulated ' + args.scenario if args.simulated else 'real GPU'}, "
              f"--interval {args.interval:g}, pty {width}x{height}, {args.runs} runs: "
              f"{args.warmup:g} s warm-up then {args.seconds:g} s side by side; "
              f"GPU processes shown: {len(pids)}")
        names = (*NAMES, "textual") if args.floor else NAMES
        commands["textual"] = [py, "-c", FLOOR, f"{args.interval:g}", str(height), str(width)]
        wants = {"gputop": want, "nvitop": want, "textual": re.compile(rb"FLOOR-DRAWN")}
        results: dict[str, dict[str, list[float]]] = {
            n: {"first": [], "cpu": [], "rss": [], "threads": []} for n in names}
        for run in range(args.runs):
            order = NAMES if run % 2 == 0 else NAMES[::-1]
            order = (*order, "textual") if args.floor else order
            monitors: dict[str, Monitor] = {}
            try:
                for name in order:  # one after the other: each first frame on its own
                    monitors[name] = Monitor(name, commands[name], width, height, env,
                                             wants[name])
                    results[name]["first"].append(monitors[name].first_frame())
                time.sleep(args.warmup)
                cpu0 = {n: m.cpu() for n, m in monitors.items()}
                wall0 = time.monotonic()
                time.sleep(args.seconds)
                wall = time.monotonic() - wall0
                for name, mon in monitors.items():
                    results[name]["cpu"].append(100.0 * (mon.cpu() - cpu0[name]) / wall)
                    results[name]["rss"].append(mon.ps.memory_info().rss / 2**20)
                    results[name]["threads"].append(float(mon.ps.num_threads()))
            finally:
                for mon in monitors.values():
                    mon.stop()
            print(f"run {run + 1} ({order[0]} first): " + "; ".join(
                f"{n} first frame {results[n]['first'][-1]:.2f} s, CPU "
                f"{results[n]['cpu'][-1]:.2f} %, RSS {results[n]['rss'][-1]:.1f} MiB, "
                f"{results[n]['threads'][-1]:.0f} threads" for n in names), flush=True)
    finally:
        if job is not None:
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended on its own (no GPU, no torch)
                pass
            job.wait(10)
        if standins is not None:
            standins.stop()

    g, n = results["gputop"], results["nvitop"]
    print()
    print("| figure (min / median / max) | gputop | nvitop | ratio | goal (median) |")
    print("| --- | --- | --- | --- | --- |")
    for key, label, goal in (("cpu", "CPU, % of one core", "<= 1.00"),
                             ("rss", "RSS, MiB", "<= 1.5"),
                             ("first", "first frame, s", "<= 1.2")):
        ratios = [a / b for a, b in zip(g[key], n[key])]
        met = "met" if statistics.median(ratios) <= float(goal.split()[-1]) else "NOT met"
        print(f"| {label} | {spread(g[key])} | {spread(n[key])} | {spread(ratios)} | "
              f"{goal}: {met} |")
    print(f"| threads | {spread(g['threads'], '{:.0f}')} | {spread(n['threads'], '{:.0f}')} "
          f"| | |")
    if args.floor:
        f = results["textual"]
        print("\nTextual's floor (a minimal Textual app redrawing a screenful of text each "
              "interval), same run:")
        print("| figure (min / median / max) | minimal Textual app | its ratio to nvitop | "
              "gputop over it |")
        print("| --- | --- | --- | --- |")
        for key, label in (("cpu", "CPU, % of one core"), ("rss", "RSS, MiB"),
                           ("first", "first frame, s")):
            print(f"| {label} | {spread(f[key])} | "
                  f"{spread([a / b for a, b in zip(f[key], n[key])])} | "
                  f"{spread([a / b for a, b in zip(g[key], f[key])])} |")
    print(f"\nmedian ratios gputop/nvitop: CPU "
          f"{statistics.median(a / b for a, b in zip(g['cpu'], n['cpu'])):.2f}, RSS "
          f"{statistics.median(a / b for a, b in zip(g['rss'], n['rss'])):.2f}, first frame "
          f"{statistics.median(a / b for a, b in zip(g['first'], n['first'])):.2f}")
    print(machine_line(args.simulated).replace("machine:", "machine after:", 1))
    print(f"total {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
