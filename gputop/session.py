"""Open a Sampler on the real driver or on a demo scenario, and close everything after.

The demo puts the simulated NVML behind the bindings, starts the stand-in processes and tells the
simulated driver their real pids; the rest of gputop cannot tell the difference.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from gputop.collect.host import HostCollector
from gputop.collect.nvml import NvmlCollector
from gputop.collect.sampler import AgentProbe, Sampler
from gputop.model import Snapshot


def _agent_probe() -> AgentProbe:
    from gputop.agent import client

    def probe(_gpu_pids: set[int]) -> dict[int, dict]:
        statuses = {}
        for pid in client.list_agents():
            status = client.agent_status(pid)
            if status is not None:
                statuses[pid] = status
        return statuses

    return probe


def warn_on_stderr(line: str) -> None:
    print(f"gputop: warning: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def open_sampler(
    demo: str | None = None,
    gpus: list[int] | None = None,
    seed: int = 0,
    agents: bool = True,
    clock=None,
    wait_for_workers: float = 1.5,
    host: HostCollector | None = None,
    trainer: bool = True,
    on_standin_failure: Callable[[str], None] | None = warn_on_stderr,
) -> Iterator[Sampler]:
    """A ready Sampler; with ``demo`` the simulated GPUs and their stand-in processes run too.

    The first sample waits up to ``wait_for_workers`` seconds for the stand-ins to fork their
    workers (a fraction of a second; the torch demo takes longer to import torch, and a running
    monitor shows its workers as they appear, so it should not wait for that); the driver is
    opened meanwhile. ``host``: a HostCollector made earlier (its CPU counters were primed
    then). ``trainer``: start the demo's real torch trainer (see demo/standins.py);
    ``on_standin_failure``: told in one line when a stand-in of the demo ends on its own."""
    probe = _agent_probe() if agents else None
    if demo is None:
        sampler = Sampler(NvmlCollector(gpus), host, agent_probe=probe)
        sampler.open()
        try:
            yield sampler
        finally:
            sampler.close()
        return

    from gputop.collect import simnvml
    from gputop.collect.scenarios import SCENARIOS
    from gputop.demo.attach import attached_pids
    from gputop.demo.standins import StandIns, wait_ready

    scenario = SCENARIOS[demo]
    attached = attached_pids(len(scenario.gpus))  # GPUTOP_DEMO_PIDS: the user's processes
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, seed=seed, clock=clock,
                                                pcie_sample_s=simnvml.PCIE_SAMPLE_S))
    try:
        with StandIns(scenario, trainer, on_standin_failure) as standins:
            for index, pids in {**standins.start(skip=attached), **attached}.items():
                sim.set_processes(index, pids)
            sampler = Sampler(NvmlCollector(gpus), host, agent_probe=probe, simulated=demo)
            sampler.open()  # while the stand-ins start
            try:
                if wait_for_workers > 0:
                    wait_ready(standins, timeout=wait_for_workers)
                yield sampler
            finally:
                sampler.close()
    finally:
        simnvml.uninstall()


def sample_every(sampler: Sampler, interval: float, duration: float | None) -> Iterator[Snapshot]:
    """Snapshots every ``interval`` seconds on a fixed schedule, for ``duration`` (None: forever).

    A tick that runs late does not make the next ones burst to catch up."""
    start = tick = time.monotonic()
    while duration is None or time.monotonic() - start < duration:
        yield sampler.sample()
        tick += interval
        delay = tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            tick = time.monotonic()
