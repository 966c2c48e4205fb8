"""The live monitor's cost against nvitop's, measured in one run on the same simulated GPUs.

Both run in tmux at the same size (160x50 by default) on the tour's simulated driver (10
simulated GPUs, each with a different problem), at a 1 s interval, on a host with ~300
processes:
- gputop: `gputop --interval 1` with its charts and live diagnosis on, in a Python process that
  first puts gputop's simulated NVML behind nvidia-ml-py (benchmarks/gputop_simulated.py): the
  monitor's own code path, as on a node with a driver (`--gputop demo` runs
  `gputop --demo tour --interval 1` instead, the demo's own machinery included);
- nvitop: `nvitop --interval 1` in a Python process that puts the same simulated NVML behind
  nvidia-ml-py (benchmarks/nvitop_simulated.py), so both read the same driver.
The GPUs' processes (the tour's stand-ins by default, or one `sleep` per GPU with
--gpu-processes plain) are started once by this script and handed to both through
GPUTOP_DEMO_PIDS, so the two monitors show the same processes and neither starts its own.

It prints:
- time to first frame: from the command line typed at a shell prompt to a screen that shows
  the GPUs and their processes (--starts pairs, gputop then nvitop); gputop's first frame is
  the plain one it paints from its first sample while Textual loads, and the time to its full
  interface is printed beside it;
- for each of --runs runs, both monitors started side by side for --seconds after --warmup,
  each one's own process only (threads included): CPU as % of one core (mean: CPU time over
  wall time; and the median of 1 s readings), RSS and threads at the end;
- a table of min / median / max of each figure and of the gputop/nvitop ratios (per run; for
  the first frame per pair), against the goals (median): CPU <= 1.00, RSS <= 1.5, first
  frame <= 1.2; with the machine's load average before and after;
- gputop's frame times (GPUTOP_FRAME_LOG): the frame handler's wall and CPU time, and the
  wall time until the frame is painted.

Other work on the machine slows both alike; compare ratios, not absolute figures, across
machines.

Usage: python benchmarks/bench_tui.py [--gputop node|demo] [--gpu-processes standins|plain]
                                      [--seconds 60] [--warmup 10] [--size 160x50]
                                      [--interval 1] [--processes 300] [--starts 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(REPO))

from harness import percentile, side_by_side_ready, spread, warm_start  # noqa: E402

from gputop.demo.standins import StandIns, wait_ready  # noqa: E402
from gputop.sim.scenarios import SCENARIOS  # noqa: E402

TIMEOUT_S = 60.0


class Pane:
    """A private tmux server with one pane running an interactive shell."""

    def __init__(self, width: int, height: int, env: dict[str, str]) -> None:
        self.socket = f"gputop-bench-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "b", "-x", str(width),
                  "-y", str(height), "-c", str(REPO), "bash --norc --noprofile")
        self.shell = int(self.tmux("display-message", "-p", "-t", "b", "#{pane_pid}").strip())
        self.tmux("send-keys", "-t", "b", "-l", "PS1='$ '")
        self.tmux("send-keys", "-t", "b", "Enter")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, check=True,
                              capture_output=True, text=True, timeout=TIMEOUT_S).stdout

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", "b", "-l", line)
        self.tmux("send-keys", "-t", "b", "Enter")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "b")

    def program(self) -> psutil.Process | None:
        try:
            children = psutil.Process(self.shell).children()
        except psutil.Error:
            return None
        return children[0] if children else None

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def commands(interval: float, gputop_mode: str) -> dict[str, str]:
    python = sys.executable
    if gputop_mode == "node":  # the monitor's own path, the simulator put in as for nvitop
        gputop = f"{python} benchmarks/gputop_simulated.py tour"
    else:
        gputop = f"{shutil.which('gputop') or f'{python} -m gputop'} --demo tour"
    return {
        "gputop": f"{gputop} --interval {interval:g}",
        "nvitop": f"{python} benchmarks/nvitop_simulated.py tour --interval {interval:g} "
                  f"2>/dev/null",
    }


def gpu_processes(stack: contextlib.ExitStack, scenario, kind: str) -> dict[int, list[int]]:
    """The processes the simulated GPUs report, one per GPU, stopped when ``stack`` closes:
    the tour's stand-ins (training processes with gputop's agent and DataLoader workers, so
    gputop also probes agents and samples stacks) or plain `sleep` processes."""
    if kind == "standins":
        standins = stack.enter_context(StandIns(scenario))
        pids_by_gpu = standins.start()
        wait_ready(standins, timeout=TIMEOUT_S)
        return pids_by_gpu
    sleepers = [subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
                for _ in scenario.gpus]
    for sleeper in sleepers:
        stack.callback(sleeper.wait)
        stack.callback(sleeper.kill)
    return {index: [sleeper.pid] for index, sleeper in enumerate(sleepers)}


def shows_gpus_and_processes(name: str, screen: str, pids: list[int]) -> bool:
    """The first frame: the GPUs (gputop names their models; nvitop, with 8 GPUs and their
    processes, shows its compact rows without names) and at least one GPU process."""
    gpus = ("A100" in screen and "H100" in screen) if name == "gputop" else (
        "NVITOP" in screen and "MEM:" in screen)
    return gpus and any(f" {pid} " in screen for pid in pids)


def interface_drawn(screen: str) -> bool:
    """gputop's interface (Textual) on screen: its footer of keys under its GPU panel, past the
    plain first frame (plain_frame.py) that shows the same GPUs and processes before it."""
    return "q Quit" in screen and "loading the interface..." not in screen and "A100" in screen


def first_frame(width: int, height: int, env: dict[str, str], name: str, command: str,
                pids: list[int], interface: list[float] | None = None) -> float:
    """Seconds to the first frame; for gputop, the seconds to its interface are appended to
    ``interface``."""
    pane = Pane(width, height, env)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while "$" not in pane.screen() and time.monotonic() < deadline:
            time.sleep(0.02)
        started = time.monotonic()
        pane.type(command)
        while not shows_gpus_and_processes(name, pane.screen(), pids):
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_tui: no first frame from: {command}\n"
                                 f"{pane.screen()}")
            time.sleep(0.01)
        first = time.monotonic() - started
        while interface is not None and not interface_drawn(pane.screen()):
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_tui: no interface from: {command}\n{pane.screen()}")
            time.sleep(0.01)
        if interface is not None:
            interface.append(time.monotonic() - started)
        return first
    finally:
        pane.close()


def side_by_side(args: argparse.Namespace, width: int, height: int, env: dict[str, str],
                 cmd: dict[str, str], pids: list[int], frame_log: Path, panes: list[Pane],
                 keep: bool) -> dict[str, dict[str, float]]:
    """Both monitors started in their own panes, drawing at the same time: each one's CPU
    (mean: CPU time over wall time; median of 1 s readings) over --seconds after --warmup,
    its RSS and threads at the end. ``keep``: leave the panes open (in ``panes``) for the
    resize timing; otherwise they are closed here."""
    procs: dict[str, psutil.Process] = {}
    mine: list[Pane] = []
    try:
        for name in ("gputop", "nvitop"):
            pane_env = dict(env, GPUTOP_FRAME_LOG=str(frame_log)) if name == "gputop" else env
            pane = Pane(width, height, pane_env)
            mine.append(pane)
            pane.type(cmd[name])
        deadline = time.monotonic() + TIMEOUT_S
        for name, pane in zip(("gputop", "nvitop"), mine):
            while not shows_gpus_and_processes(name, pane.screen(), pids):
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench_tui: {name} shows no frame")
                time.sleep(0.05)
            program = pane.program()
            if program is None:
                raise SystemExit(f"bench_tui: {name} ended")
            procs[name] = program
        time.sleep(args.warmup)
        readings: dict[str, list[float]] = {name: [] for name in procs}
        cpu0 = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}
        last = dict(cpu0)
        wall0 = time.monotonic()
        previous = wall0
        while time.monotonic() - wall0 < args.seconds:
            time.sleep(1.0)
            now = time.monotonic()
            for name, proc in procs.items():
                cpu = sum(proc.cpu_times()[:2])
                readings[name].append(100.0 * (cpu - last[name]) / (now - previous))
                last[name] = cpu
            previous = now
        wall = time.monotonic() - wall0
        return {name: {"mean": 100.0 * (last[name] - cpu0[name]) / wall,
                       "median": statistics.median(readings[name]),
                       "rss": proc.memory_info().rss / 2**20,
                       "threads": float(proc.num_threads())}
                for name, proc in procs.items()}
    finally:
        if keep:
            panes.extend(mine)
        else:
            for pane in mine:
                pane.close()


RESIZES = ((80, 24), (200, 60), (120, 40), (160, 50))


def laid_out(screen: str, width: int, height: int) -> bool:
    """The screen drawn for this size: as many lines, the footer last, and what the size
    shows (compact rows and the findings banner or panel, or cards as wide as the screen)."""
    lines = screen.splitlines()
    if len(lines) != height or "q Quit" not in lines[-1]:
        return False
    if width < 120:
        return any(line.startswith(" 7 NVIDIA L40S") for line in lines)
    panel = any("─ findings" in line for line in lines)
    if width >= 160:
        return panel and any(len(line.rstrip()) >= width - 2 and ("╮" in line or "┓" in line)
                             for line in lines[1:4])
    return panel and any(line.startswith(" 7 NVIDIA L40S") for line in lines)


def resize_latency(pane: Pane, rounds: int) -> list[float]:
    """Seconds from each resize of the window to the screen laid out for the new size."""
    out = []
    for _ in range(rounds):
        for width, height in RESIZES:
            started = time.monotonic()
            pane.tmux("resize-window", "-t", "b", "-x", str(width), "-y", str(height))
            deadline = started + TIMEOUT_S
            while not laid_out(pane.screen(), width, height):
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench_tui: not laid out for {width}x{height}:\n"
                                     f"{pane.screen()}")
                time.sleep(0.005)
            out.append(time.monotonic() - started)
            time.sleep(0.5)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds after the first frame that are not counted")
    parser.add_argument("--size", default="160x50")
    parser.add_argument("--gputop", choices=("node", "demo"), default="node",
                        help="node: gputop's own command line (no --demo) with the simulated "
                             "NVML put behind nvidia-ml-py, as nvitop's is (what runs on a "
                             "node); demo: `gputop --demo tour`, which also runs the demo's "
                             "own machinery (default: node)")
    parser.add_argument("--gpu-processes", choices=("standins", "plain"), default="standins",
                        help="the GPUs' processes: standins, the tour's training stand-ins "
                             "with the agent (gputop probes them and samples their stacks); "
                             "plain: one `sleep` per GPU (default: standins)")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=300,
                        help="start sleeping processes until the host has this many")
    parser.add_argument("--runs", type=int, default=3,
                        help="side-by-side runs of --seconds each (ratios: min/median/max)")
    parser.add_argument("--starts", type=int, default=3,
                        help="starts of each monitor timed to the first frame")
    parser.add_argument("--resizes", type=int, default=3,
                        help="rounds of resizes (80x24, 200x60, 120x40, 160x50) timed")
    args = parser.parse_args()
    if not side_by_side_ready("bench_tui"):
        return 2
    width, height = (int(x) for x in args.size.split("x"))
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    warm_start(str(REPO / "gputop"))
    fillers: list[subprocess.Popen] = []
    frame_log = Path(tempfile.mkdtemp(prefix="gputop-bench-")) / "frames.log"
    scenario = SCENARIOS["tour"]
    panes: list[Pane] = []
    with contextlib.ExitStack() as stack:
        pids_by_gpu = gpu_processes(stack, scenario, args.gpu_processes)
        pids = [p for ps in pids_by_gpu.values() for p in ps]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["GPUTOP_DEMO_PIDS"] = ",".join(f"{i}:{p}" for i, ps in pids_by_gpu.items()
                                           for p in ps)
        cmd = commands(args.interval, args.gputop)
        try:
            while len(psutil.pids()) < args.processes and len(fillers) < 400:
                fillers.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
            host_processes = len(psutil.pids())
            starts: dict[str, list[float]] = {"gputop": [], "nvitop": []}
            interface: list[float] = []
            for _ in range(args.starts):
                for name in ("gputop", "nvitop"):
                    starts[name].append(first_frame(width, height, env, name, cmd[name], pids,
                                                    interface if name == "gputop" else None))

            # Side by side: both draw at the same time on the same machine, --runs times.
            runs: list[dict[str, dict[str, float]]] = []
            frames_before = 0
            for run in range(args.runs):
                last_run = run == args.runs - 1
                if last_run:
                    frames_before = (len(frame_log.read_text().splitlines())
                                     if frame_log.exists() else 0)
                runs.append(side_by_side(args, width, height, env, cmd, pids, frame_log,
                                         panes, keep=last_run))
                print(f"run {run + 1}: " + "; ".join(
                    f"{name} CPU mean {r['mean']:.2f} % (median {r['median']:.2f}), RSS "
                    f"{r['rss']:.1f} MiB, {r['threads']:.0f} threads"
                    for name, r in runs[-1].items()), flush=True)
            resizes = resize_latency(panes[0], args.resizes) if panes else []  # gputop's
        finally:
            for pane in panes:
                pane.close()
            for filler in fillers:
                filler.kill()
            for filler in fillers:
                filler.wait()

    lines = frame_log.read_text().splitlines()[frames_before:] if frame_log.exists() else []
    shutil.rmtree(frame_log.parent, ignore_errors=True)
    g = {key: [r["gputop"][key] for r in runs] for key in ("mean", "median", "rss", "threads")}
    n = {key: [r["nvitop"][key] for r in runs] for key in ("mean", "median", "rss", "threads")}
    first_ratios = [a / b for a, b in zip(starts["gputop"], starts["nvitop"])]
    mode = "on a node (gputop_simulated.py)" if args.gputop == "node" else "--demo tour"
    print(f"gputop as {mode}, the GPUs' processes: {args.gpu_processes}; "
          f"tour ({len(scenario.gpus)} simulated GPUs), --interval {args.interval:g}, "
          f"tmux {width}x{height}, host processes: {host_processes}; charts and live diagnosis on; {args.runs} runs "
          f"of {args.seconds:g} s after {args.warmup:g} s warm-up; load average before "
          f"{load_before}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    print("| figure (min / median / max) | gputop | nvitop | gputop/nvitop | goal (median) |")
    print("| --- | --- | --- | --- | --- |")
    for label, a, b, ratios, goal in (
            ("CPU, mean % of one core", g["mean"], n["mean"],
             [x / y for x, y in zip(g["mean"], n["mean"])], 1.0),
            (f"RSS after {args.warmup + args.seconds:g} s, MiB", g["rss"], n["rss"],
             [x / y for x, y in zip(g["rss"], n["rss"])], 1.5),
            (f"first frame, s ({len(first_ratios)} pairs)", starts["gputop"], starts["nvitop"],
             first_ratios, 1.2)):
        verdict = "met" if statistics.median(ratios) <= goal else "NOT met"
        print(f"| {label} | {spread(a)} | {spread(b)} | {spread(ratios)} | <= {goal:.2f}: "
              f"{verdict} |")
    print(f"| threads | {spread(g['threads'], '{:.0f}')} | {spread(n['threads'], '{:.0f}')} | "
          f"| |")
    print(f"(gputop's first frame is its plain frame of the first sample; its interface, "
          f"Textual, follows at {spread(interface)} s: "
          f"{spread([a / b for a, b in zip(interface, starts['nvitop'])])} x nvitop's first frame)")
    print(f"median ratios gputop/nvitop: CPU "
          f"{statistics.median(x / y for x, y in zip(g['mean'], n['mean'])):.2f}, RSS "
          f"{statistics.median(x / y for x, y in zip(g['rss'], n['rss'])):.2f}, first frame "
          f"{statistics.median(first_ratios):.2f}")
    print(f"CPU per 1 s tick (median run): gputop {statistics.median(g['mean']) * 10:.1f} ms, "
          f"nvitop {statistics.median(n['mean']) * 10:.1f} ms; the median of 1 s readings "
          f"(10 ms kernel ticks): gputop {spread(g['median'])} %, nvitop {spread(n['median'])} %")
    if lines:
        handler = [float(line.split()[0]) for line in lines]
        handler_cpu = [float(line.split()[1]) for line in lines]
        painted = [float(line.split()[2]) for line in lines]
        print(f"gputop frames: {len(lines)}; frame handler wall median "
              f"{statistics.median(handler):.2f} ms (p95 {percentile(handler, 0.95):.2f}), CPU "
              f"median {statistics.median(handler_cpu):.2f} ms (p95 "
              f"{percentile(handler_cpu, 0.95):.2f}); until painted median "
              f"{statistics.median(painted):.2f} ms (p95 {percentile(painted, 0.95):.2f})")
    if resizes:
        print(f"gputop resize to a laid-out screen (80x24, 200x60, 120x40, 160x50; "
              f"{len(resizes)} resizes, tmux polled every 5 ms): median "
              f"{statistics.median(resizes) * 1000:.0f} ms, worst {max(resizes) * 1000:.0f} ms "
              f"(goal < 500 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
