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
from gputop.core.agent_status import AgentStatus
from gputop.core.model import Snapshot


def _agent_probe() -> AgentProbe:
    """Every agent's status each tick, all at once within one deadline (another user's socket
    that never answers costs a tick at most ``status_probe.PROBE_DEADLINE_S``, once), then the
    agents of other pid namespaces (containers) that the plain search does not find."""
    from gputop.client import namespaces
    from gputop.client.status_probe import StatusProbe

    namespaces.wire()  # the client's search falls back on containers
    plain = StatusProbe()

    def probe(gpu_pids: set[int]) -> dict[int, AgentStatus]:
        statuses = plain(gpu_pids)
        statuses.update(namespaces.probe(gpu_pids, statuses))
        return statuses

    return probe


def warn_on_stderr(line: str) -> None:
    from gputop.core.format import safe_text

    print(f"gputop: warning: {safe_text(line)}", file=sys.stderr, flush=True)


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
    demo_elapsed: float = 0.0,
) -> Iterator[Sampler]:
    """A ready Sampler; with ``demo`` the simulated GPUs and their stand-in processes run too.

    The first sample waits up to ``wait_for_workers`` seconds for the stand-ins to fork their
    workers (a fraction of a second; the torch demo takes longer to import torch, and a running
    monitor shows its workers as they appear, so it should not wait for that); the driver is
    opened meanwhile. ``host``: a HostCollector made earlier (its CPU counters were primed
    then). ``trainer``: start the demo's real torch trainer (see demo/standins.py);
    ``on_standin_failure``: told in one line when a stand-in of the demo ends on its own;
    ``demo_elapsed``: how long the simulated jobs have run when the demo opens."""
    probe = _agent_probe() if agents else None
    if demo is None:
        sampler = Sampler(NvmlCollector(gpus), host, agent_probe=probe)
        sampler.open()
        try:
            yield sampler
        finally:
            sampler.close()
        return

    from gputop.demo.attach import attached_pids
    from gputop.demo.standins import StandIns, wait_ready
    from gputop.sim import nvml as simnvml
    from gputop.sim.scenarios import SCENARIOS

    scenario = SCENARIOS[demo]
    attached = attached_pids(len(scenario.gpus))  # GPUTOP_DEMO_PIDS: the user's processes
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, seed=seed, clock=clock,
                                                pcie_sample_s=simnvml.PCIE_SAMPLE_S,
                                                elapsed=demo_elapsed))
    try:
        with StandIns(scenario, trainer, on_standin_failure, sim.origin) as standins:
            started = standins.start(skip=attached)
            for index, pids in {**started, **attached}.items():
                sim.set_processes(index, pids)
            sampler = Sampler(NvmlCollector(gpus), host, agent_probe=probe, simulated=demo,
                              nvml_pids_local=_demo_pids_local(bool(started)))
            sampler.open()  # while the stand-ins start
            try:
                if wait_for_workers > 0:
                    wait_ready(standins, timeout=wait_for_workers)
                yield sampler
            finally:
                sampler.close()
    finally:
        simnvml.uninstall()


def _demo_pids_local(standins: bool) -> bool:
    """Whether the simulated driver's pids are this namespace's. It reports host pids as
    NVML does ($GPUTOP_DEMO_PIDS are host pids); in the host's namespace those are ours. In a
    container, the stand-ins the demo starts are known only by their pids here, so a demo with
    stand-ins reports this namespace's pids (and $GPUTOP_DEMO_PIDS are taken as such too)."""
    from gputop.core.pidns import in_init_pidns

    return in_init_pidns() or standins


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
