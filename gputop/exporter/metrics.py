"""Prometheus metric families from one snapshot and the active findings. Pure: no I/O.

Units are Prometheus' base units, spelled in the name: bytes for every memory (GPU and host
alike; dcgm-exporter and nvitop-exporter give framebuffer memory in MiB), W, degrees C; and as
dcgm-exporter, percent for utilization, MHz, the NVML clock-event bitmask, with its label names
for a GPU (``gpu``, ``UUID``; its ``modelName`` is ``model_name``: promtool's lint wants label
names in snake_case), so a dcgm-exporter dashboard moves over by renaming the metric (and
``* 1048576`` for memory); `GPU_METRICS` lists the dcgm-exporter and
nvitop-exporter counterpart of each (the README prints it as a table). Labels never hold a pid,
a command line or any free text: a series per GPU, per training job (by its job, its owner's
uid, rank and GPU) and per finding id.

As dcgm-exporter does, a MIG device has series of its own with ``GPU_I_ID`` and
``GPU_I_PROFILE`` (empty on whole GPUs), and a GPU (or MIG device) whose processes all belong
to one workload carries its ``pod``, ``namespace``, ``container`` and ``hpc_job`` (Slurm);
empty labels are absent for Prometheus, so a plain GPU's series are named as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from gputop.core.agent_status import AgentStatus
from gputop.core.mig_view import instance_gpu, instance_processes
from gputop.core.model import Efficiency, GpuSample, HostSample, MigSample, ProcSample, Snapshot
from gputop.core.process_info import OWNER_LABELS, label_values
from gputop.core.validate import real
from gputop.diagnostics.findings import SEVERITY_RANK

GPU_LABELS = ["gpu", "UUID", "model_name", "GPU_I_ID", "GPU_I_PROFILE", *OWNER_LABELS]
# NVML's clock-event ("throttle") reason bits, as gputop.collect.nvml names them.
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}


def _div(value: float | None, by: float) -> float | None:
    return None if value is None else value / by


def _bytes(field: str) -> Callable[[GpuSample], float | None]:
    def value(g: GpuSample) -> float | None:
        v = getattr(g, field)
        return None if v is None else float(v)

    return value


def _mem_free(g: GpuSample) -> float | None:
    if g.mem_total is None or g.mem_used is None:
        return None
    return float(max(0, g.mem_total - g.mem_used - (g.mem_reserved or 0)))


@dataclass(frozen=True)
class GpuMetric:
    name: str
    help: str
    dcgm: str  # the dcgm-exporter field it matches ("" when none)
    nvitop: str  # the nvitop-exporter metric it matches ("" when none)
    value: Callable[[GpuSample], float | None]
    counter: bool = False


GPU_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric("gputop_gpu_utilization_percent", "GPU utilization: share of time a kernel ran (%)",
              "DCGM_FI_DEV_GPU_UTIL", "gpu_utilization_Percentage", lambda g: g.util_gpu),
    GpuMetric("gputop_gpu_memory_copy_utilization_percent",
              "Memory controller utilization (%)", "DCGM_FI_DEV_MEM_COPY_UTIL",
              "gpu_memory_utilization_Percentage", lambda g: g.util_mem),
    GpuMetric("gputop_gpu_memory_used_bytes", "Framebuffer memory used (bytes)",
              "DCGM_FI_DEV_FB_USED (MiB)", "gpu_memory_used_MiB", _bytes("mem_used")),
    GpuMetric("gputop_gpu_memory_free_bytes", "Framebuffer memory free (bytes)",
              "DCGM_FI_DEV_FB_FREE (MiB)", "gpu_memory_free_MiB", _mem_free),
    GpuMetric("gputop_gpu_memory_total_bytes", "Framebuffer memory total (bytes)",
              "DCGM_FI_DEV_FB_TOTAL (MiB)", "gpu_memory_total_MiB",
              _bytes("mem_total")),
    GpuMetric("gputop_gpu_power_usage_watts", "Power draw (W)", "DCGM_FI_DEV_POWER_USAGE",
              "gpu_power_usage_W", lambda g: g.power_w),
    GpuMetric("gputop_gpu_power_limit_watts", "Enforced power limit (W)",
              "DCGM_FI_DEV_POWER_MGMT_LIMIT", "gpu_power_limit_W", lambda g: g.power_limit_w),
    GpuMetric("gputop_gpu_energy_joules", "Energy used since the driver loaded (J; dcgm: mJ)",
              "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "", lambda g: g.energy_j, counter=True),
    GpuMetric("gputop_gpu_temperature_celsius", "GPU temperature (C)", "DCGM_FI_DEV_GPU_TEMP",
              "gpu_temperature_C", lambda g: g.temperature_c),
    GpuMetric("gputop_gpu_fan_speed_percent", "Fan speed (%)", "DCGM_FI_DEV_FAN_SPEED",
              "gpu_fan_speed_Percentage", lambda g: g.fan_percent),
    GpuMetric("gputop_gpu_sm_clock_mhz", "SM clock (MHz)", "DCGM_FI_DEV_SM_CLOCK",
              "gpu_clock_sm_MHz", lambda g: g.sm_clock_mhz),
    GpuMetric("gputop_gpu_memory_clock_mhz", "Memory clock (MHz)", "DCGM_FI_DEV_MEM_CLOCK",
              "gpu_clock_memory_MHz", lambda g: g.mem_clock_mhz),
    GpuMetric("gputop_gpu_pcie_tx_bytes_per_second", "PCIe transmit rate (bytes/s)",
              "DCGM_FI_PROF_PCIE_TX_BYTES", "gpu_pcie_tx_throughput_MiBps (MiB/s)",
              lambda g: None if g.pcie_tx_mbs is None else g.pcie_tx_mbs * 1e6),
    GpuMetric("gputop_gpu_pcie_rx_bytes_per_second", "PCIe receive rate (bytes/s)",
              "DCGM_FI_PROF_PCIE_RX_BYTES", "gpu_pcie_rx_throughput_MiBps (MiB/s)",
              lambda g: None if g.pcie_rx_mbs is None else g.pcie_rx_mbs * 1e6),
    GpuMetric("gputop_gpu_sm_active_ratio", "Share of SMs with a warp resident, 0-1 (GPM)",
              "DCGM_FI_PROF_SM_ACTIVE", "", lambda g: _div(g.sm_active, 100.0)),
    GpuMetric("gputop_gpu_sm_occupancy_ratio", "Resident warps over the maximum, 0-1 (GPM)",
              "DCGM_FI_PROF_SM_OCCUPANCY", "", lambda g: _div(g.sm_occupancy, 100.0)),
    GpuMetric("gputop_gpu_tensor_active_ratio", "Tensor pipes busy, 0-1 (GPM)",
              "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "", lambda g: _div(g.tensor_active, 100.0)),
    GpuMetric("gputop_gpu_dram_active_ratio", "Device memory interface busy, 0-1 (GPM)",
              "DCGM_FI_PROF_DRAM_ACTIVE", "", lambda g: _div(g.dram_active, 100.0)),
    GpuMetric("gputop_gpu_clocks_event_reasons", "NVML clock-event reasons (bitmask)",
              "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "",
              lambda g: float(sum(CLOCK_EVENT_BITS.get(e, 0) for e in g.clock_events))),
    GpuMetric("gputop_gpu_ecc_volatile_errors", "ECC errors since the driver loaded",
              "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL + DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "",
              lambda g: None if g.ecc_volatile is None else float(g.ecc_volatile)),
    GpuMetric("gputop_gpu_processes", "Processes on the GPU", "", "",
              lambda g: float(len(g.processes))),
)

HOST_METRICS: tuple[tuple[str, str, Callable[[HostSample], float | None]], ...] = (
    ("gputop_host_cpu_utilization_percent", "Host CPU busy, all cores (%)",
     lambda h: h.cpu_percent),
    ("gputop_host_cpu_iowait_percent", "Host CPU time waiting on I/O (%)", lambda h: h.iowait),
    ("gputop_host_cpu_steal_percent", "Host CPU time stolen by the hypervisor (%)",
     lambda h: h.steal),
    ("gputop_host_cpus", "Logical CPUs", lambda h: h.cpu_count),
    ("gputop_host_load1", "Load average over 1 minute", lambda h: h.load_1),
    ("gputop_host_load5", "Load average over 5 minutes", lambda h: h.load_5),
    ("gputop_host_load15", "Load average over 15 minutes", lambda h: h.load_15),
    ("gputop_host_memory_used_bytes", "Host memory used (bytes)", lambda h: h.memory_used),
    ("gputop_host_memory_total_bytes", "Host memory total (bytes)", lambda h: h.memory_total),
    ("gputop_host_swap_used_bytes", "Swap used (bytes)", lambda h: h.swap_used),
    ("gputop_host_disk_read_bytes_per_second", "Disk read rate (bytes/s)",
     lambda h: h.disk_read_bps),
    ("gputop_host_disk_write_bytes_per_second", "Disk write rate (bytes/s)",
     lambda h: h.disk_write_bps),
    ("gputop_host_network_receive_bytes_per_second", "Network receive rate (bytes/s)",
     lambda h: h.net_rx_bps),
    ("gputop_host_network_transmit_bytes_per_second", "Network transmit rate (bytes/s)",
     lambda h: h.net_tx_bps),
)
JOB_LABELS = ["job_id", "uid", "rank", "gpu"]  # the job and its owner first: see _jobs
# ("job_id", not "job": Prometheus sets "job" to the scrape job and would rename ours.)


@dataclass
class _FindingEntry:
    severity: str
    active: bool
    seconds: float = 0.0


@dataclass
class FindingClock:
    """Which findings are active and for how long they have been, per (id, GPU): what the
    finding series export. Severity is the worst of the findings with that id on that GPU."""

    entries: dict[tuple[str, str, str], _FindingEntry] = field(default_factory=dict)

    def update(self, findings: Iterable, elapsed: float) -> None:
        current: dict[tuple[str, str, str], str] = {}
        for f in findings:
            instance = getattr(f, "gpu_instance", None)  # a MIG device of that GPU
            key = (f.id, "" if f.gpu is None else str(f.gpu),
                   "" if instance is None else str(instance))
            old = current.get(key)
            if old is None or SEVERITY_RANK[f.severity] > SEVERITY_RANK[old]:
                current[key] = f.severity
        for key, entry in self.entries.items():
            entry.active = key in current
        for key, severity in current.items():
            entry = self.entries.setdefault(key, _FindingEntry(severity, True))
            entry.severity = severity
            entry.seconds += elapsed

    def families(self) -> list[Metric]:
        active = GaugeMetricFamily(
            "gputop_finding_active",
            "1 while a live finding is raised (id: the finding, gpu: its GPU or empty, "
            "GPU_I_ID: its MIG device or empty)",
            labels=["id", "severity", "gpu", "GPU_I_ID"])
        seconds = CounterMetricFamily(
            "gputop_finding_active_seconds",
            "Seconds the finding has been active since the exporter started",
            labels=["id", "gpu", "GPU_I_ID"])
        for (finding_id, gpu, instance), entry in sorted(self.entries.items()):
            active.add_metric([finding_id, entry.severity, gpu, instance],
                              1.0 if entry.active else 0.0)
            seconds.add_metric([finding_id, gpu, instance], round(entry.seconds, 3))
        return [active, seconds]


# What a MIG device has series of: its own memory, GPM activity and processes (NVML reports
# no utilization for it; power, clocks and temperature are the board's).
MIG_METRICS = frozenset({
    "gputop_gpu_memory_used_bytes", "gputop_gpu_memory_free_bytes", "gputop_gpu_memory_total_bytes",
    "gputop_gpu_sm_active_ratio", "gputop_gpu_sm_occupancy_ratio",
    "gputop_gpu_tensor_active_ratio", "gputop_gpu_dram_active_ratio", "gputop_gpu_processes",
})


def _devices(snap: Snapshot) -> list[tuple[GpuSample, list[str], bool]]:
    """(the GPU or a MIG device as a GpuSample, its labels, whether a MIG device)."""
    out = []
    for g in snap.gpus:
        out.append((g, _gpu_labels(g), False))
        if g.mig_mode and not g.lost:
            out.extend((instance_gpu(g, m), _gpu_labels(g, m), True) for m in g.mig)
    return out


def gpu_families(snap: Snapshot) -> list[Metric]:
    families = []
    devices = _devices(snap)
    for metric in GPU_METRICS:
        cls = CounterMetricFamily if metric.counter else GaugeMetricFamily
        family = cls(metric.name, metric.help, labels=GPU_LABELS)
        for g, labels, mig in devices:
            if g.lost or (mig and metric.name not in MIG_METRICS):
                continue
            value = metric.value(g)
            if value is not None:
                family.add_metric(labels, float(value))
        families.append(family)
    lost = GaugeMetricFamily("gputop_gpu_lost", "1 when the GPU fell off the bus (XID 79)",
                             labels=GPU_LABELS)
    for g in snap.gpus:
        lost.add_metric(_gpu_labels(g), 1.0 if g.lost else 0.0)
    families.append(lost)
    return families


def _workload(procs: tuple[ProcSample, ...]) -> list[str]:
    """The owner labels of the processes when they all belong to one workload, else empty."""
    owners = {tuple(label_values(p.owner).values()) for p in procs}
    if len(owners) == 1:
        return list(owners.pop())
    return [""] * len(OWNER_LABELS)


def _gpu_labels(g: GpuSample, m: MigSample | None = None) -> list[str]:
    base = [str(g.index), g.uuid or "", g.name or ""]
    if m is not None:
        return [*base, str(m.gpu_instance), m.profile or "",
                *_workload(instance_processes(g, m))]
    # A MIG-mode GPU's processes are its MIG devices' workloads, not the board's.
    return [*base, "", "", *_workload(() if g.mig_mode else g.processes)]


def host_families(host: HostSample) -> list[Metric]:
    families = []
    for name, text, value in HOST_METRICS:
        family = GaugeMetricFamily(name, text)
        v = value(host)
        if v is not None:
            family.add_metric([], float(v))
        families.append(family)
    return families


def job_identity(p: ProcSample) -> str:
    """The job a process belongs to, for its series: the Slurm job of its cgroup (which the
    process cannot leave), else the job its agent names (torchrun's run id, Slurm's from the
    environment), else the process itself (its pid and start time: a new process under a
    reused pid is a new series). The agent's word only ever names series of its own uid."""
    if p.owner is not None and p.owner.slurm_job:
        return f"slurm:{p.owner.slurm_job}"
    claimed = p.agent.job_id if p.agent is not None else None
    if isinstance(claimed, str) and not claimed.startswith("launcher:") and \
            not (claimed.startswith("slurm:") and p.owner is not None and p.owner.slurm_claim):
        return claimed[:128]
    started = int(p.create_time) if p.create_time is not None else 0
    return f"pid:{p.pid}@{started}"


JobKey = tuple[str, str, str, str]  # (job id, uid, rank, gpu): JOB_LABELS' order


def _jobs(snap: Snapshot) -> dict[JobKey, ProcSample]:
    """Training processes with the gputop agent, keyed by their job, their owner's uid, rank
    and first GPU. The uid is part of the key, so no process writes another user's series,
    whatever it claims (a job id, a rank, a step rate); two processes of one user with one key
    (the same job and rank twice): the one that started first keeps it."""
    seen: dict[int, tuple[str, ProcSample]] = {}
    for g in snap.gpus:
        for p in g.processes:
            if p.agent and p.pid not in seen:
                seen[p.pid] = (str(g.index), p)
    for p in snap.other_processes:
        if p.agent and p.pid not in seen:
            seen[p.pid] = ("", p)
    jobs: dict[JobKey, ProcSample] = {}
    for gpu, p in seen.values():
        rank = p.agent.rank if p.agent is not None else None
        rank_label = "" if rank is None else str(rank)
        key = (job_identity(p), "" if p.uid is None else str(p.uid), rank_label, gpu)
        other = jobs.get(key)
        if other is None or _older(p, other):
            jobs[key] = p
    return jobs


def _older(p: ProcSample, other: ProcSample) -> bool:
    return (p.create_time or float("inf"), p.pid) < (other.create_time or float("inf"), other.pid)


def _value(agent: AgentStatus | None, name: str) -> float | None:
    # The agent's reply was checked where it was read (gputop.core.agent_status): what is here is
    # in range; this only turns it into a float for the family.
    return real(getattr(agent, name)) if agent is not None else None


def job_families(snap: Snapshot) -> list[Metric]:
    rate = GaugeMetricFamily("gputop_job_steps_per_second",
                             "Optimizer steps per second (gputop agent)", labels=JOB_LABELS)
    # A summary's quantiles (no _sum or _count: the agent reports only the quantiles of its
    # window); a gauge with a "quantile" label is what promtool warns about.
    step = Metric("gputop_job_step_time_seconds",
                  "Step time quantiles over the agent's window (s)", "summary")
    wait = GaugeMetricFamily("gputop_job_dataloader_wait_ratio",
                             "Share of each step spent waiting for the DataLoader, 0-1",
                             labels=JOB_LABELS)
    steps = CounterMetricFamily("gputop_job_steps", "Optimizer steps since the job started",
                                labels=JOB_LABELS)
    for key, p in sorted(_jobs(snap).items()):
        agent = p.agent
        labels = list(key)
        for family, key in ((rate, "steps_per_s"), (wait, "dataloader_wait_share")):
            value = _value(agent, key)
            if value is not None:
                family.add_metric(labels, value)
        for quantile, key in (("0.5", "step_time_p50_s"), ("0.95", "step_time_p95_s")):
            value = _value(agent, key)
            if value is not None:
                step.add_sample(step.name, {**dict(zip(JOB_LABELS, labels, strict=True)),
                                            "quantile": quantile}, value)
        count = _value(agent, "steps")
        if count is not None:
            steps.add_metric(labels, count)
    return [rate, step, wait, steps]


# The efficiency of each training job (gputop.core.efficiency): (name, help, value of Efficiency).
EFFICIENCY_METRICS: tuple[tuple[str, str, Callable[[Efficiency], float | None]], ...] = (
    ("gputop_job_mfu_ratio", "Model FLOPs utilization, 0-1: counted FLOPs per step x steps/s "
     "over the GPU's dense datasheet peak for the precision used", lambda e: e.mfu),
    ("gputop_job_goodput_ratio", "Share of the job's time in productive steps, 0-1 (agent)",
     lambda e: e.goodput),
    ("gputop_job_energy_per_step_joules", "GPU energy per optimizer step (J, NVML energy "
     "counter)", lambda e: e.j_per_step),
    ("gputop_job_energy_per_sample_joules", "GPU energy per training sample (J)",
     lambda e: e.j_per_sample),
    ("gputop_job_flops_per_step", "FLOPs of one optimizer step (agent's FlopCounterMode count)",
     lambda e: e.flops_per_step),
    ("gputop_job_achieved_flops_per_second", "FLOPs per step x steps per second (FLOP/s)",
     lambda e: e.achieved_flops),
)


def efficiency_families(snap: Snapshot) -> list[Metric]:
    """MFU, goodput and energy per step of each job, with the job's labels; the goodput
    ledger's seconds as a counter per category (bounded: seven categories)."""
    families = [GaugeMetricFamily(name, text, labels=JOB_LABELS)
                for name, text, _ in EFFICIENCY_METRICS]
    seconds = CounterMetricFamily("gputop_job_goodput_seconds",
                                  "Seconds of the job's life by where they went (productive, "
                                  "startup, dataloader, capture, checkpoint, stall, hang)",
                                  labels=[*JOB_LABELS, "category"])
    for key, p in sorted(_jobs(snap).items()):
        eff = p.efficiency
        if eff is None:
            continue
        for family, (_, _, value) in zip(families, EFFICIENCY_METRICS):
            v = value(eff)
            if v is not None:
                family.add_metric(list(key), float(v))
        for category, value in eff.goodput_s.items():
            seconds.add_metric([*key, category], value)
    return [*families, seconds]


def meta_families(snap: Snapshot | None, version: str, sample_seconds: float | None
                  ) -> list[Metric]:
    info = InfoMetricFamily("gputop", "gputop exporter and driver")
    driver = GaugeMetricFamily("gputop_driver_available", "1 when NVML answers")
    last = GaugeMetricFamily("gputop_last_sample_timestamp_seconds",
                             "Unix time of the newest sample")
    cost = GaugeMetricFamily("gputop_sample_duration_seconds",
                             "Time the last sample and the live rules took (s)")
    if snap is not None:
        d = snap.driver
        info.add_metric([], {"version": version, "hostname": snap.host.hostname,
                             "driver_version": d.driver_version or "",
                             "cuda_version": d.cuda_version or "",
                             "simulated": d.simulated or ""})
        driver.add_metric([], 1.0 if d.available else 0.0)
        last.add_metric([], snap.time)
    if sample_seconds is not None:
        cost.add_metric([], sample_seconds)
    return [info, driver, last, cost]


def all_families(snap: Snapshot | None, clock: FindingClock, version: str,
                 sample_seconds: float | None = None) -> list[Metric]:
    families = meta_families(snap, version, sample_seconds)
    if snap is not None:
        families += gpu_families(snap) + host_families(snap.host) + job_families(snap)
        families += efficiency_families(snap)
    families += clock.families()
    return families


def series_count(families: Iterable[Metric]) -> int:
    return sum(len(f.samples) for f in families)


