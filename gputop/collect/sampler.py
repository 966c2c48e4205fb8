"""One sampling tick: GPUs (NVML), host and the training processes (psutil) -> a Snapshot.

Blocking calls live here and run on the caller's thread (a worker thread in the TUI).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gputop.collect.host import HostCollector
from gputop.collect.nvml import NvmlCollector
from gputop.efficiency import EfficiencyTracker
from gputop.model import DriverInfo, GpuSample, ProcSample, Snapshot

# Looks up the agents of training processes: returns {pid: status dict}. Set by the session
# when the agent IPC is available; must be cheap and must not raise.
AgentProbe = Callable[[set[int]], dict[int, dict]]


class Sampler:
    def __init__(
        self,
        nvml: NvmlCollector,
        host: HostCollector | None = None,
        agent_probe: AgentProbe | None = None,
        simulated: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.host = host or HostCollector()
        self.agent_probe = agent_probe
        self.simulated = simulated
        self.clock = clock  # the time stamped on snapshots (a sped-up clock in benchmarks)
        self.driver = DriverInfo(available=False, error="not opened")
        self.efficiency = EfficiencyTracker()  # MFU, goodput, J/step of the agents' processes

    def open(self) -> DriverInfo:
        driver = self.nvml.open()
        if self.simulated and driver.available:
            driver = DriverInfo(**{**driver.__dict__, "simulated": self.simulated})
        self.driver = driver
        return driver

    def close(self) -> None:
        self.nvml.close()

    def sample(self) -> Snapshot:
        now = self.clock()
        if self.driver.available:
            self.nvml.start_pcie()  # the slow reads overlap the host's
        host = self.host.sample_host()
        gpu_rows = self.nvml.sample() if self.driver.available else []
        gpu_pids = {pid for _, procs, _ in gpu_rows for pid, _ in procs}
        agents = self.agent_probe(gpu_pids) if self.agent_probe else {}
        placed: dict[int, list[tuple[GpuSample, int | None]]] = {}
        for sample, procs, _ in gpu_rows:
            for pid, gpu_mem in procs:
                if pid in agents:
                    placed.setdefault(pid, []).append((sample, gpu_mem))
        efficiency = self.efficiency.update(now, placed, agents)
        gpus: list[GpuSample] = []
        measured: dict[int, ProcSample] = {}
        for sample, procs, proc_util in gpu_rows:
            rows = []
            for pid, gpu_mem in procs:
                base = measured.get(pid)
                if base is None:
                    base = measured[pid] = self.host.sample_process(pid)
                rows.append(_with(base, gpu_mem=gpu_mem, sm_util=proc_util.get(pid),
                                  agent=agents.get(pid), efficiency=efficiency.get(pid)))
            gpus.append(_with(sample, processes=tuple(rows)))
        others = tuple(
            _with(self.host.sample_process(pid), agent=status, efficiency=efficiency.get(pid))
            for pid, status in sorted(agents.items())
            if pid not in gpu_pids
        )
        self.host.end_tick()
        return Snapshot(time=now, host=host, driver=self.driver, gpus=tuple(gpus), other_processes=others)


def _with(obj, **changes):
    """``dataclasses.replace`` for the model's frozen dataclasses (no __post_init__, no
    slots) without its walk over every field: a tick makes ~20 of these."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    unknown = changes.keys() - obj.__dict__.keys()
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]}")
    new.__dict__.update(changes)
    return new
