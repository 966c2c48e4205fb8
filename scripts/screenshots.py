"""Write SVG screenshots of the live monitor into screenshots/ from headless demo runs.

Each scenario runs for real (simulated NVML, the stand-in processes, psutil) but its driver clock
steps one simulated second per sample, so a few seconds of sampling give the charts 90 s of
history. The samples then feed the app without a terminal, at a fixed size, with the live rules
run over them (the findings panel). For the diagnosis screen, the input-starved demo's real
training process is captured through the capture service (3 steps, py-spy beside) and the trace
analyzed, as `p` does; for the stacks view, the tour's first stand-in without an agent (GPU 0
runs the torch trainer with the agent) and its workers are sampled with py-spy, as `p` does on
a process without the agent.

Usage: python scripts/screenshots.py [--out screenshots] [--samples 90]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputop.capture.service import CaptureSettings, capture  # noqa: E402
from gputop.client.agents import list_agents  # noqa: E402
from gputop.client.session import open_sampler  # noqa: E402
from gputop.core.model import Snapshot  # noqa: E402
from gputop.diagnostics.trace.analysis import TraceAnalysis  # noqa: E402
from gputop.stacks.profile import StackReport  # noqa: E402
from gputop.stacks.pyspy import sample_stacks  # noqa: E402
from gputop.tui.monitor.app import GputopApp  # noqa: E402
from gputop.tui.screens.stacks_screen import StacksScreen  # noqa: E402


@dataclass(frozen=True)
class Shot:
    name: str
    scenario: str
    size: tuple[int, int]
    keys: tuple[str, ...] = ()
    diagnosis: bool = False  # show the diagnosis of a capture of the GPU 0 process
    stacks: bool = False  # the Python stacks of the first process without an agent (`p`)


SHOTS = (
    Shot("tour-200x60", "tour", (200, 60)),
    Shot("tour-120x40", "tour", (120, 40)),
    Shot("tour-80x24", "tour", (80, 24)),
    Shot("tour-findings-80x24", "tour", (80, 24), ("f",)),
    Shot("input-starved-120x40", "input-starved", (120, 40)),
    Shot("input-starved-process-view-120x40", "input-starved", (120, 40), ("enter",)),
    Shot("input-starved-diagnosis-120x40", "input-starved", (120, 40), diagnosis=True),
    Shot("tour-stacks-120x40", "tour", (120, 40), stacks=True),
    Shot("mig-120x40", "mig", (120, 40)),
)


@dataclass(frozen=True)
class Capture:
    pid: int
    trace: str
    analysis: TraceAnalysis
    source: str = ""  # where in the code the top costs are (py-spy joined to the steps)


@dataclass(frozen=True)
class Stacks:
    pid: int
    command: str
    report: StackReport


class SteppedClock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def capture_gpu0(snap: Snapshot, out: Path) -> Capture:
    """Capture 3 steps of GPU 0's process through its agent and analyze the trace."""
    pid = snap.gpus[0].processes[0].pid
    deadline = time.monotonic() + 30
    while pid not in list_agents():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: pid {pid} has no agent (is torch installed?)")
        time.sleep(0.1)
    result = capture(pid, CaptureSettings(out=str(out)))  # what `p` does
    return Capture(pid, result.trace, result.analysis, result.source_text())


def stacks_without_agent(snap: Snapshot) -> Stacks:
    """Sample the Python stacks of the first GPU process without an agent (and its workers)
    with py-spy: what `p` shows for it."""
    proc = next(p for g in snap.gpus for p in g.processes if p.visible and not p.agent)
    return Stacks(proc.pid, proc.cmdline or proc.name, sample_stacks(proc.pid, 2))


def wait_for_flop_counts(sampler, timeout: float = 120.0) -> None:
    """Until every GPU process with the agent has counted its FLOPs (after warm-up), so the
    screenshots show its MFU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = sampler.sample()
        waiting = [p for g in snap.gpus for p in g.processes
                   if p.agent and (p.efficiency is None or p.efficiency.flops_per_step is None)]
        if not waiting:
            return
        time.sleep(0.5)


def sample_scenario(scenario: str, samples: int, capture_to: Path | None = None,
                    stacks: bool = False) -> tuple[list[Snapshot], Capture | None, Stacks | None]:
    """``samples`` snapshots one simulated second apart, with real host and process data;
    with ``capture_to``, a capture of GPU 0's process made meanwhile; with ``stacks``, the
    Python stacks of the first process without an agent."""
    clock = SteppedClock()
    start = time.time() - samples
    snaps = []
    capture = None
    sampled_stacks = None
    with open_sampler(scenario, seed=0, clock=clock, wait_for_workers=10.0) as sampler:
        wait_for_flop_counts(sampler)
        for i in range(samples):
            clock.t = float(i)
            time.sleep(0.05)  # a real interval for the CPU rates of the processes
            snaps.append(replace(sampler.sample(), time=start + i))
        if capture_to is not None:
            capture = capture_gpu0(snaps[-1], capture_to)
        if stacks:
            sampled_stacks = stacks_without_agent(snaps[-1])
    return snaps, capture, sampled_stacks


async def screenshot(snaps: list[Snapshot], shot: Shot, capture: Capture | None,
                     stacks: Stacks | None = None) -> str:
    app = GputopApp(snapshots=snaps, diagnose=True)
    async with app.run_test(size=shot.size) as pilot:
        for _ in range(300):
            if app.frames_rendered and app.table.row_count:
                break
            await pilot.pause(0.01)
        for key in shot.keys:
            await pilot.press(key)
        for _ in range(300):
            if not shot.keys or app.frame.process is not None or app.screen is not app.screen_stack[0]:
                break
            await pilot.pause(0.01)
        if shot.diagnosis and capture is not None:
            app.show_diagnosis(capture.pid, capture.analysis, capture.trace, capture.source)
            await pilot.pause()
        if shot.stacks and stacks is not None:
            app.push_screen(StacksScreen(stacks.pid, stacks.command, report=stacks.report))
            await pilot.pause()
        await pilot.pause()
        return app.export_screenshot(title=f"gputop --demo {shot.scenario}")


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; a screenshot is for everyone
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "screenshots")
    parser.add_argument("--samples", type=int, default=90)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sampled: dict[str, tuple[list[Snapshot], Capture | None, Stacks | None]] = {}
    # The capture's trace is only needed for the screenshot: it goes into a temporary directory.
    traces = Path(tempfile.mkdtemp(prefix="gputop-screenshots-"))
    try:
        for shot in SHOTS:
            if shot.scenario not in sampled:
                wants = any(s.diagnosis and s.scenario == shot.scenario for s in SHOTS)
                stacks = any(s.stacks and s.scenario == shot.scenario for s in SHOTS)
                sampled[shot.scenario] = sample_scenario(shot.scenario, args.samples,
                                                         traces if wants else None, stacks)
            snaps, capture, stacks_shown = sampled[shot.scenario]
            svg = asyncio.run(screenshot(snaps, shot, capture, stacks_shown))
            path = args.out / f"{shot.name}.svg"
            write_atomically(path, svg)
            print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    finally:
        shutil.rmtree(traces, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
