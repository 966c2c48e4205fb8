"""One sampling tick: GPUs (NVML), host and the training processes (psutil) -> a Snapshot.

Blocking calls live here and run on the caller's thread (a worker thread in the TUI).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from gputop.collect.containers import PerProcess, read_owner
from gputop.collect.host import HostCollector
from gputop.collect.nvml import NvmlCollector
from gputop.collect.pidmap import PidResolver, Resolved
from gputop.core.agent_status import AgentStatus
from gputop.core.compile_health import compile_health
from gputop.core.efficiency import EfficiencyTracker
from gputop.core.model import DriverInfo, GpuSample, ProcSample, Snapshot, evolve
from gputop.core.pidns import in_init_pidns, ns_pid

# Why a pid NVML reports is missing from /proc in the host's own pid namespace.
NOT_IN_PROC = ("pid {pid} is not in /proc: it has just exited, or /proc is mounted with hidepid "
               "(another user's process)")

# Looks up the agents of training processes: returns {pid: status dict}. Set by the session
# when the agent IPC is available; must be cheap and must not raise.
AgentProbe = Callable[[set[int]], dict[int, AgentStatus]]


class Sampler:
    def __init__(
        self,
        nvml: NvmlCollector,
        host: HostCollector | None = None,
        agent_probe: AgentProbe | None = None,
        simulated: str | None = None,
        clock: Callable[[], float] = time.time,
        nvml_pids_local: bool | None = None,
    ) -> None:
        self.nvml = nvml
        self.host = host or HostCollector()
        self.agent_probe = agent_probe
        self.simulated = simulated
        self.clock = clock  # the time stamped on snapshots (a sped-up clock in benchmarks)
        self.driver = DriverInfo(available=False, error="not opened")
        # Containers: NVML reports host pids; they are ours only in the host's pid
        # namespace (the demo says otherwise when it reports pids of this namespace).
        self.nvml_pids_local = in_init_pidns() if nvml_pids_local is None else nvml_pids_local
        self.resolver = PidResolver()
        self.identity = PerProcess(lambda pid: (ns_pid(pid), read_owner(pid)))
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
        resolved = self._resolve(gpu_rows, agents)
        placed: dict[int, list[tuple[GpuSample, int | None]]] = {}
        for sample, procs, _ in gpu_rows:
            for pid, gpu_mem in procs:
                if pid in agents:
                    placed.setdefault(pid, []).append((sample, gpu_mem))
        efficiency = self.efficiency.update(now, placed, agents)
        gpus: list[GpuSample] = []
        measured: dict[int, ProcSample] = {}
        for sample, procs, proc_util in gpu_rows:
            instances = {pid: (m.gpu_instance, m.compute_instance)
                         for m in sample.mig for pid in m.pids}
            rows = []
            for pid, gpu_mem in procs:
                base = measured.get(pid)
                if base is None:
                    base = measured[pid] = self._process(pid, resolved, agents)
                gi, ci = instances.get(pid, (None, None))
                rows.append(evolve(base, gpu_mem=gpu_mem, sm_util=proc_util.get(pid),
                                   gpu_instance=gi, compute_instance=ci,
                                   efficiency=efficiency.get(pid),
                                   compiled=compile_health(base.agent)))
            gpus.append(evolve(sample, processes=tuple(rows)))
        shown = {p.pid for p in measured.values()} | gpu_pids
        others = tuple(
            evolve(self._identify(self.host.sample_process(pid)), agent=status,
                   efficiency=efficiency.get(pid), compiled=compile_health(status))
            for pid, status in sorted(agents.items())
            if pid not in shown and status.pid in (pid, None)
        )
        self.host.end_tick()
        return Snapshot(time=now, host=host, driver=self.driver, gpus=tuple(gpus), other_processes=others)

    # -- containers ----------------------------------------------------------------

    def _resolve(self, gpu_rows, agents: dict[int, AgentStatus]) -> dict[int, Resolved]:
        """NVML's host pids to pids here, when they are not this namespace's."""
        if self.nvml_pids_local or not gpu_rows:
            return {}
        per_gpu = {sample.index: [pid for pid, _ in procs] for sample, procs, _ in gpu_rows}
        return self.resolver.resolve(per_gpu, self.nvml.minor_numbers(), agents, _alive)

    def _process(self, pid: int, resolved: dict[int, Resolved],
                 agents: dict[int, AgentStatus]) -> ProcSample:
        """A GPU process NVML names ``pid``, measured here with its agent's status."""
        found = resolved.get(pid)
        if found is None:  # NVML's pids are ours
            base = self.host.sample_process(pid)
            if not base.visible:
                base = evolve(base, hidden=NOT_IN_PROC.format(pid=pid))
            return evolve(self._identify(base), agent=agents.get(pid))
        if found.local is not None:
            base = self._identify(self.host.sample_process(found.local))
            return evolve(base, host_pid=pid if found.local != pid else None,
                          agent=agents.get(found.local))
        if found.agent is not None:  # an agent of another namespace reported this host pid
            argv = found.agent.argv
            inner = found.agent.pid
            return ProcSample(pid=pid, name=(argv[0].rsplit("/", 1)[-1] if argv else "?"),
                              cmdline=" ".join(argv), visible=False, agent=found.agent,
                              ns_pid=inner,
                              hidden="in a pid namespace this gputop cannot see; named by "
                                     "its agent")
        return ProcSample(pid=pid, name="(host pid: not in this pid namespace)", visible=False,
                          hidden=found.hidden)

    def _identify(self, proc: ProcSample) -> ProcSample:
        """Its pid inside its own container and its owner (container, pod, Slurm job)."""
        if not proc.visible:
            return proc
        inner, owner = self.identity.get(proc.pid, proc.create_time)
        if inner is None and owner is None:
            return proc
        return evolve(proc, ns_pid=inner, owner=owner)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")
