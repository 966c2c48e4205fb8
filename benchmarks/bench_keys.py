"""How fast each key answers, gputop against nvitop, side by side in tmux on the same simulated
driver.

Both monitors run in their own tmux pane at the same size (160x50 by default) on the tour's
simulated GPUs (benchmarks/gputop_simulated.py and benchmarks/nvitop_simulated.py put the same
simulated NVML behind nvidia-ml-py, with the same processes: the tour's stand-ins, or one `sleep`
per GPU, handed to both through GPUTOP_DEMO_PIDS). In each run both are started, then the same
keys are pressed in each, one monitor after the other, each timed from `tmux send-keys` to the
first capture of the pane that shows the key's effect (the pane polled every 5 ms):

- first full interface: from the command typed at the prompt to gputop's Textual interface
  (past its plain first frame) / nvitop's first frame with the GPUs and their processes;
- Enter: the process view (gputop's process screen; nvitop's process metrics);
- Esc: back to the main screen;
- k: the signal dialog (then cancelled, not timed);
- ?: the help (gputop `?`, nvitop `h`; closed, not timed);
- sort: the next sort order (gputop `s`, nvitop `.`): the table's header changes;
- q: the monitor gone and the shell's prompt back.

It prints each key's seconds (min / median / max over --runs) for both, the gputop/nvitop ratio
of each run (min / median / max), and the goals: every key's median ratio <= 1.0 and its median
under 0.3 s on a quiet machine; the full interface <= 1.5x nvitop's first frame. Other work on
the machine slows both alike: compare ratios, and state the load average printed with them.

Usage: python benchmarks/bench_keys.py [--runs 5] [--size 160x50] [--interval 1]
                                       [--gpu-processes standins|plain]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_tui import (  # noqa: E402
    Pane,
    commands,
    gpu_processes,
    interface_drawn,
    shows_gpus_and_processes,
    spread,
)
from harness import side_by_side_ready, warm_start  # noqa: E402

from gputop.sim.scenarios import SCENARIOS  # noqa: E402

TIMEOUT_S = 60.0
POLL_S = 0.005
SETTLE_S = 1.0  # between keys: the screen at rest, a tick or so


def gputop_main(screen: str) -> bool:
    return "PID USER" in screen and "q Quit" in screen and "Cancel (n)" not in screen \
        and "gputop keys" not in screen


def nvitop_main(screen: str) -> bool:
    return "Processes:" in screen and "MAX CPU:" not in screen \
        and "Send signal to" not in screen and "(C) Xuehai Pan" not in screen


def header_line(screen: str, label: str) -> str:
    return next((line for line in screen.splitlines() if label in line), "")


# Each key: (name, gputop's key, its "changed" test, nvitop's key, its test). A test gets the
# screen before the key and the screen now.
Check = Callable[[str, str], bool]
KEYS: tuple[tuple[str, str, Check, str, Check], ...] = (
    ("Enter", "Enter", lambda b, s: "PID USER" not in s and "workers CPU" in s,
     "Enter", lambda b, s: "MAX CPU:" in s),
    ("Esc", "Escape", lambda b, s: gputop_main(s), "Escape", lambda b, s: nvitop_main(s)),
    ("k", "k", lambda b, s: "Cancel (n)" in s, "k", lambda b, s: "Send signal to" in s),
    ("?", "?", lambda b, s: "gputop keys" in s, "h", lambda b, s: "(C) Xuehai Pan" in s),
    ("sort", "s", lambda b, s: header_line(s, "PID USER") != header_line(b, "PID USER"),
     ".", lambda b, s: header_line(s, "USER  GPU-MEM") != header_line(b, "USER  GPU-MEM")),
)
# What closes a view a timed key opened, untimed: (gputop's key, nvitop's key).
CLOSE = {"k": ("n", "Escape"), "?": ("Escape", "Escape")}


def wait_screen(pane: Pane, test: Callable[[str], bool], what: str) -> float:
    """Seconds until ``test`` holds for the pane's screen (from now)."""
    started = time.monotonic()
    while True:
        screen = pane.screen()
        if test(screen):
            return time.monotonic() - started
        if time.monotonic() - started > TIMEOUT_S:
            raise SystemExit(f"bench_keys: timed out waiting for {what}:\n{screen}")
        time.sleep(POLL_S)


def press(pane: Pane, key: str, check: Check, what: str) -> float:
    before = pane.screen()
    started = time.monotonic()
    pane.tmux("send-keys", "-t", "b", key)
    while True:
        screen = pane.screen()
        if check(before, screen):
            return time.monotonic() - started
        if time.monotonic() - started > TIMEOUT_S:
            raise SystemExit(f"bench_keys: {what} changed nothing:\n{screen}")
        time.sleep(POLL_S)


def prompt_back(pane: Pane) -> bool:
    return pane.program() is None and pane.screen().rstrip().endswith("$")


def one_run(width: int, height: int, env: dict[str, str], cmd: dict[str, str],
            pids: list[int]) -> dict[str, dict[str, float]]:
    """Both monitors started, every key pressed in each; seconds per key and monitor."""
    out: dict[str, dict[str, float]] = {"gputop": {}, "nvitop": {}}
    panes = {name: Pane(width, height, env) for name in ("gputop", "nvitop")}
    try:
        for name, pane in panes.items():
            wait_screen(pane, lambda s: "$" in s, "the prompt")
            started = time.monotonic()
            pane.type(cmd[name])
            if name == "gputop":
                test = interface_drawn
            else:
                def test(s: str) -> bool:
                    return shows_gpus_and_processes("nvitop", s, pids)
            wait_screen(pane, test, f"{name}'s interface")
            out[name]["first full interface"] = time.monotonic() - started
        time.sleep(SETTLE_S * 3)  # both sampling, the charts filling
        # nvitop selects nothing at start: the first process, as gputop's cursor starts on it.
        panes["nvitop"].tmux("send-keys", "-t", "b", "Down")
        time.sleep(SETTLE_S)
        for label, g_key, g_check, n_key, n_check in KEYS:
            for name, key, check in (("gputop", g_key, g_check), ("nvitop", n_key, n_check)):
                pane = panes[name]
                out[name][label] = press(pane, key, check, f"{name} {label}")
                time.sleep(SETTLE_S)
                if label in CLOSE:
                    pane.tmux("send-keys", "-t", "b", CLOSE[label][name == "nvitop"])
                    wait_screen(pane, gputop_main if name == "gputop" else nvitop_main,
                                f"{name} back from {label}")
                    time.sleep(SETTLE_S)
        for name, pane in panes.items():
            started = time.monotonic()
            pane.tmux("send-keys", "-t", "b", "q")
            while not prompt_back(pane):
                if time.monotonic() - started > TIMEOUT_S:
                    raise SystemExit(f"bench_keys: {name} did not quit:\n{pane.screen()}")
                time.sleep(POLL_S)
            out[name]["q"] = time.monotonic() - started
    finally:
        for pane in panes.values():
            pane.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", default="160x50")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--gpu-processes", choices=("standins", "plain"), default="standins",
                        help="the GPUs' processes: the tour's stand-ins (training processes "
                             "with the agent) or one `sleep` per GPU (default: standins)")
    args = parser.parse_args()
    if not side_by_side_ready("bench_keys"):
        return 2
    width, height = (int(x) for x in args.size.split("x"))
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    warm_start(str(REPO / "gputop"))
    scenario = SCENARIOS["tour"]
    runs: list[dict[str, dict[str, float]]] = []
    with contextlib.ExitStack() as stack:
        pids_by_gpu = gpu_processes(stack, scenario, args.gpu_processes)
        pids = [p for ps in pids_by_gpu.values() for p in ps]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["GPUTOP_DEMO_PIDS"] = ",".join(f"{i}:{p}" for i, ps in pids_by_gpu.items()
                                           for p in ps)
        cmd = commands(args.interval, "node")
        for run in range(args.runs):
            runs.append(one_run(width, height, env, cmd, pids))
            print(f"run {run + 1}: " + "; ".join(
                f"{label} {runs[-1]['gputop'][label]:.3f}/{runs[-1]['nvitop'][label]:.3f} s"
                for label in runs[-1]["gputop"]), flush=True)
    labels = list(runs[0]["gputop"])
    print(f"gputop (gputop_simulated.py) and nvitop 1.7.2 (nvitop_simulated.py) side by side, "
          f"tour ({len(scenario.gpus)} simulated GPUs), GPU processes: {args.gpu_processes}, "
          f"--interval {args.interval:g}, tmux {width}x{height}, host processes "
          f"{len(psutil.pids())}; {args.runs} runs; load average before {load_before}, after "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print("| key (s: min / median / max) | gputop | nvitop | gputop/nvitop | goal (median) |")
    print("| --- | --- | --- | --- | --- |")
    for label in labels:
        g = [r["gputop"][label] for r in runs]
        n = [r["nvitop"][label] for r in runs]
        ratios = [a / b for a, b in zip(g, n)]
        if label == "first full interface":
            met = statistics.median(ratios) <= 1.5
            goal = f"<= 1.5x: {'met' if met else 'NOT met'}"
        else:
            met = statistics.median(ratios) <= 1.0 and statistics.median(g) < 0.3
            goal = f"<= 1.0x and < 0.3 s: {'met' if met else 'NOT met'}"
        print(f"| {label} | {spread(g, '{:.3f}')} | {spread(n, '{:.3f}')} | {spread(ratios)} "
              f"| {goal} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
