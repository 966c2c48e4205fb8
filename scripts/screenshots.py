"""Write SVG screenshots of the live monitor into screenshots/ from headless demo runs.

Each scenario runs for real (simulated NVML, the stand-in processes, psutil) but its driver clock
steps one simulated second per sample, so a few seconds of sampling give the charts 90 s of
history. The samples then feed the app without a terminal, at a fixed size.

Usage: python scripts/screenshots.py [--out screenshots] [--samples 90]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputop.model import Snapshot  # noqa: E402
from gputop.session import open_sampler  # noqa: E402
from gputop.tui.app import GputopApp  # noqa: E402


@dataclass(frozen=True)
class Shot:
    name: str
    scenario: str
    size: tuple[int, int]
    keys: tuple[str, ...] = ()


SHOTS = (
    Shot("tour-160x50", "tour", (160, 50)),
    Shot("input-starved-120x40", "input-starved", (120, 40)),
    Shot("tour-80x24", "tour", (80, 24)),
    Shot("input-starved-process-view-120x40", "input-starved", (120, 40), ("enter",)),
)


class SteppedClock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def sample_scenario(scenario: str, samples: int) -> list[Snapshot]:
    """``samples`` snapshots one simulated second apart, with real host and process data."""
    clock = SteppedClock()
    start = time.time() - samples
    snaps = []
    with open_sampler(scenario, seed=0, clock=clock) as sampler:
        sampler.sample()
        for i in range(samples):
            clock.t = float(i)
            time.sleep(0.05)  # a real interval for the CPU rates of the processes
            snaps.append(replace(sampler.sample(), time=start + i))
    return snaps


async def screenshot(snaps: list[Snapshot], shot: Shot) -> str:
    app = GputopApp(snapshots=snaps)
    async with app.run_test(size=shot.size) as pilot:
        for _ in range(300):
            if app.frames_rendered and app.table.row_count:
                break
            await pilot.pause(0.01)
        for key in shot.keys:
            await pilot.press(key)
        for _ in range(300):
            if not shot.keys or app.frame.process is not None:
                break
            await pilot.pause(0.01)
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
    sampled: dict[str, list[Snapshot]] = {}
    for shot in SHOTS:
        if shot.scenario not in sampled:
            sampled[shot.scenario] = sample_scenario(shot.scenario, args.samples)
        svg = asyncio.run(screenshot(sampled[shot.scenario], shot))
        path = args.out / f"{shot.name}.svg"
        write_atomically(path, svg)
        print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
