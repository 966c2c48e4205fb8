"""The monitor's threads are bounded (issue 40): on the tour's 10 simulated GPUs, after its first
ticks, one PCIe reader per 8 GPUs (not one per GPU) and no native thread outside Python's (numpy's
OpenBLAS would start one per core: 15 on a 16-core GPU node; the monitor loads no numpy at all).

The real app under Textual's Pilot in a fresh interpreter, started as commands/top.py starts
it, run until the history and the charts (after the first frame) are loaded and a few frames
are drawn.
"""

from __future__ import annotations

import json
import subprocess
import sys

from gputop.collect.nvml import GPUS_PER_READER
from tests.conftest import REPO, SLOW, cli_env

PROBE = """
import asyncio, gc, json, os, sys, threading
from gputop.commands.top import one_blas_thread
from gputop.tui.monitor.early_start import EarlySampler

gc.disable()
one_blas_thread()
early = EarlySampler("tour", None, 0).start()
from gputop.tui.monitor.app import GputopApp

app = GputopApp(demo="tour", gpus=None, interval=0.3, seed=0, auto_capture=False, early=early)


def names():
    return sorted(t.name for t in threading.enumerate())


async def main():
    seen = {}
    async with app.run_test(size=(160, 50)) as pilot:
        for _ in range(1200):
            await pilot.pause(0.05)
            pcie = [n for n in names() if n.startswith("gputop-pcie")]
            if (app.frames_rendered >= 4 and "gputop.core.history" in sys.modules
                    and "gputop.tui.widgets.chart" in sys.modules and len(pcie) <= 2):
                break
        seen = {"python": names(), "native": len(os.listdir("/proc/self/task")),
                "frames": app.frames_rendered, "numpy": "numpy" in sys.modules,
                "charts": "gputop.tui.widgets.chart" in sys.modules,
                "gpus": len(app.gpu_indices)}
    print(json.dumps(seen))


asyncio.run(main())
early.stop()
"""


def test_the_monitor_runs_one_pcie_reader_per_8_gpus_and_no_blas_threads():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=SLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["gpus"] >= 8 and seen["frames"] >= 4 and seen["charts"], seen
    assert not seen["numpy"], seen  # issue 40: the charts and the history are pure Python
    pcie = [n for n in seen["python"] if n.startswith("gputop-pcie")]
    readers = -(-seen["gpus"] // GPUS_PER_READER)
    assert 0 < readers < seen["gpus"]
    assert len(pcie) <= readers, seen  # after the first tick's, which read all GPUs at once
    # Every thread of the process is one of Python's: no BLAS pool.
    assert seen["native"] == len(seen["python"]), seen
    assert len(seen["python"]) <= 10, seen


def test_the_first_frames_sample_asks_no_agent_and_the_next_tick_does(simulated):
    """The first frame comes without the agents' status (the probe can take up to its 0.5 s
    deadline); every tick after it asks them, as before."""
    from gputop.collect.nvml import NvmlCollector
    from gputop.collect.sampler import Sampler
    from gputop.tui.monitor.early_start import first_sample

    simulated("healthy")
    asked: list[set[int]] = []

    def probe(pids: set[int]) -> dict[int, dict]:
        asked.append(set(pids))
        return {}

    sampler = Sampler(NvmlCollector(), agent_probe=probe)
    sampler.open()
    try:
        first = first_sample(sampler)
        assert first.gpus and asked == []
        assert sampler.agent_probe is probe
        sampler.sample()
        assert len(asked) == 1
    finally:
        sampler.close()
