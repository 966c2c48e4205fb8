"""Immutable samples that flow from the collectors to history, diagnostics and widgets.

Every field that a driver or the OS may refuse is ``None`` rather than a guess. Units: bytes for
memory, percent 0-100 for shares, watts, joules, MB/s, MHz, degrees C. ``to_json()`` gives the public
schema documented in the README (``gputop snapshot --json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from gputop.core.agent_status import AgentStatus


@dataclass(frozen=True)
class WorkerSample:
    """A child of a training process (a DataLoader worker, usually)."""

    pid: int
    name: str
    cpu_percent: float | None
    rss: int | None
    state: str
    threads: int | None = None


class _MemoryShare:
    """``mem_percent`` of a sample with ``mem_used`` and ``mem_total`` (a GPU, a MIG device)."""

    __slots__ = ()  # its subclasses' own slots are all their instances hold
    mem_used: int | None
    mem_total: int | None

    @property
    def mem_percent(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return 100.0 * self.mem_used / self.mem_total


# -- containers, pid namespaces and MIG ------------------------------------------


@dataclass(frozen=True)
class Owner:
    """Who a process belongs to, from its cgroups, mounts and environment (each None when it
    cannot be read): the container runtime and its container id, the Kubernetes pod (uid,
    name, namespace) and container name, and the Slurm job id. Exported under dcgm-exporter's
    label names (``pod``, ``namespace``, ``container``, ``hpc_job``)."""

    runtime: str | None = None  # docker, containerd, cri-o, podman, kubernetes
    container_id: str | None = None
    pod_uid: str | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    slurm_job: str | None = None
    # SLURM_JOB_ID of the environment where it disagrees with the cgroup's job: a claim only.
    slurm_claim: str | None = None

    def is_empty(self) -> bool:
        return not any(self.__dict__.values())


@dataclass(frozen=True)
class MigSample(_MemoryShare):
    """One MIG device of a MIG-enabled GPU (a GPU instance with its compute instance).

    NVML gives no utilization for a MIG device: ``sm_active`` and the other activities come
    from GPM (``nvmlGpmMigSampleGet``, Hopper and later) and are None where it is missing.
    The processes on it are in the parent GPU's ``processes`` with ``gpu_instance`` set;
    ``pids`` names them."""

    gpu_instance: int
    compute_instance: int | None = None
    profile: str | None = None  # "1g.10gb"
    name: str | None = None
    uuid: str | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Efficiency:
    """How much of its GPU a training process turns into work (``gputop.core.efficiency``).

    From the agent: the FLOPs of one counted step, the steps/s, the goodput ledger; from NVML:
    the board (its datasheet peak), GPM's tensor activity and the energy counter. Shares are
    0-1; a figure that cannot be known is None, with the reason in the note beside it."""

    flops_per_step: float | None = None
    precision: str | None = None  # fp32, tf32, bf16, fp16, fp8, ...: most of the counted FLOPs
    samples_per_step: int | None = None
    achieved_flops: float | None = None  # FLOP/s: flops_per_step x steps/s
    device: str | None = None  # the board whose peak is used
    peak_flops: float | None = None  # its dense peak for the precision (FLOP/s)
    peak_source: str | None = None  # the datasheet
    mfu: float | None = None
    mfu_note: str | None = None  # why there is no MFU
    best_mfu: float | None = None  # at the job's best 30 s window (same FLOP count)
    tensor_active: float | None = None  # GPM tensor activity of the GPU (%), when it has GPM
    tensor_agrees: bool | None = None  # the cross-check of MFU against tensor activity
    tensor_note: str | None = None
    goodput: float | None = None  # productive share of the time booked
    goodput_s: dict[str, float] = field(default_factory=dict)  # seconds per category
    j_per_step: float | None = None  # the GPU's energy per optimizer step
    j_per_sample: float | None = None
    energy_window_s: float | None = None  # the span J/step was measured over


@dataclass(frozen=True)
class CompiledFunction:
    """A function torch.compile compiled in a process (``gputop.core.compile_health``)."""

    function: str
    file: str | None = None
    line: int | None = None
    compiles: int = 0
    recompiles: int = 0
    fallback: bool = False  # hit the recompile limit: runs eager now


@dataclass(frozen=True)
class CompileHealth:
    """torch.compile in a process, from its agent: compiles, recompiles, graph
    breaks, recompile-limit fallbacks, seconds blocked compiling, CUDA-graph re-recordings."""

    compiles: int = 0
    recompiles: int = 0
    fallbacks: int = 0
    graph_breaks: int = 0
    compile_s: float = 0.0
    blocked_after_warmup_s: float = 0.0
    cudagraph_rerecords: int | None = None
    functions: tuple[CompiledFunction, ...] = ()
    unavailable: tuple[str, ...] = ()  # what this torch does not expose


@dataclass(frozen=True)
class CpuWait:
    """A process and its DataLoader workers' threads over one tick, from the kernel's own
    accounting: time on a CPU and time runnable but waiting in a run queue
    (/proc/PID/task/TID/schedstat), and their cgroup's CPU quota throttling (cpu.stat)."""

    run_s: float
    wait_s: float
    threads: int
    throttled_s: float | None = None  # the cgroup's throttled time in the tick
    throttled_periods: int | None = None  # quota periods in which it was throttled
    periods: int | None = None  # quota periods in the tick
    quota_cores: float | None = None  # the cgroup's CPU quota in cores (None: no quota)
    cgroup: str | None = None  # the cgroup holding the process (its path)


@dataclass(frozen=True)
class CpuUser:
    """Who else uses the CPUs: one user's processes (outside the watched jobs and gputop)
    at ``cpu_percent`` of a core in all. Another user's processes are named by the user
    only; ``top``: the busiest process's name and pid, for the user running gputop only."""

    user: str
    cpu_percent: float
    processes: int
    top: str | None = None


@dataclass(frozen=True, slots=True)
class ProcSample:
    """A process that uses a GPU, with its children measured by psutil.

    ``visible`` is False when NVML reports a pid the host cannot see (a container's pid
    namespace): it is kept and shown as such, never dropped.
    """

    pid: int
    name: str
    gpu_mem: int | None = None
    sm_util: float | None = None
    cpu_percent: float | None = None
    rss: int | None = None
    user: str | None = None
    state: str | None = None
    threads: int | None = None
    create_time: float | None = None
    cmdline: str = ""
    ppid: int | None = None
    visible: bool = True
    workers: tuple[WorkerSample, ...] = ()
    agent: AgentStatus | None = None  # checked once where it was read (core/agent_status.py)
    # Containers and MIG. ``ns_pid``: its pid inside its own pid namespace (a
    # container's pid) where that differs from ``pid``; ``host_pid``: the pid NVML reports
    # (the host's) where gputop runs in a container and ``pid`` is this namespace's;
    # ``hidden``: why a process NVML reports cannot be named from here (one line).
    ns_pid: int | None = None
    host_pid: int | None = None
    owner: Owner | None = None
    gpu_instance: int | None = None  # MIG: the GPU instance (GI) and compute instance (CI)
    compute_instance: int | None = None
    hidden: str | None = None
    efficiency: Efficiency | None = None  # MFU, goodput, J/step
    uid: int | None = None  # the real uid: whose series the exporter's job series are
    compiled: CompileHealth | None = None  # torch.compile's health
    cpu_wait: CpuWait | None = None  # its threads' run-queue wait and throttling, last tick

    @property
    def tree_cpu_percent(self) -> float:
        """CPU of the process and its workers together (100 = one core)."""
        total = self.cpu_percent or 0.0
        return total + sum(w.cpu_percent or 0.0 for w in self.workers)


@dataclass(frozen=True, slots=True)
class GpuSample(_MemoryShare):
    index: int
    uuid: str | None = None
    name: str | None = None
    bus_id: str | None = None
    lost: bool = False
    util_gpu: float | None = None
    util_mem: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    mem_reserved: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None
    pcie_tx_mbs: float | None = None
    pcie_rx_mbs: float | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    temperature_c: float | None = None
    fan_percent: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    mem_bus_width_bits: int | None = None  # the memory bus (NVML): the live bandwidth roof
    clock_events: tuple[str, ...] = ()
    pstate: int | None = None
    ecc_volatile: int | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    processes: tuple[ProcSample, ...] = ()
    # MIG: True when MIG mode is on (None: the GPU has no MIG, or did not say);
    # then NVML reports no utilization for the GPU and ``mig`` lists its MIG devices.
    mig_mode: bool | None = None
    mig: tuple[MigSample, ...] = ()


@dataclass(frozen=True)
class HostSample:
    hostname: str
    cpu_percent: float | None = None
    cpu_per_core: tuple[float, ...] = ()
    cpu_count: int | None = None
    iowait: float | None = None
    steal: float | None = None
    load_1: float | None = None
    load_5: float | None = None
    load_15: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    swap_used: int | None = None
    swap_total: int | None = None
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    net_rx_bps: float | None = None
    net_tx_bps: float | None = None
    process_count: int | None = None
    # The kernel's CPU pressure (PSI "some" avg10, %: the share of time a runnable task
    # waited for a CPU) and the busiest users outside the watched jobs, when looked at.
    cpu_pressure: float | None = None
    cpu_users: tuple[CpuUser, ...] = ()


@dataclass(frozen=True)
class DriverInfo:
    available: bool
    driver_version: str | None = None
    cuda_version: str | None = None
    nvml_version: str | None = None
    error: str | None = None
    simulated: str | None = None  # scenario name when the GPUs are simulated


@dataclass(frozen=True)
class Snapshot:
    time: float
    host: HostSample
    driver: DriverInfo
    gpus: tuple[GpuSample, ...] = ()
    # Training processes with an agent that no GPU reports (no driver, CPU runs).
    other_processes: tuple[ProcSample, ...] = field(default=())


_T = TypeVar("_T")


def evolve(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for the model's frozen dataclasses (no __post_init__) without
    its walk over every field: a tick makes ~30 of these."""
    cls = type(obj)
    new = object.__new__(cls)
    slots = getattr(cls, "__slots__", None)
    if not slots:
        new.__dict__.update(obj.__dict__)
        unknown = changes.keys() - obj.__dict__.keys()
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]}")
        new.__dict__.update(changes)
        return new
    # Slotted (the samples a tick makes by the hundred: no dict of ~1.5 KiB each).
    unknown = changes.keys() - set(slots)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]}")
    for name in slots:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(obj, name))
    return new
