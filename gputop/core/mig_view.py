"""A MIG device seen as a GPU of its own: what the exporter labels per GPU instance and what the
live rules judge per instance. Pure.

The view carries the instance's own readings (memory, GPM activity, its processes) and the
parent's physical ones that every instance shares (clocks and their events, temperature,
P-state, ECC); it has no utilization (NVML reports none for a MIG device), no power or PCIe
(whole-board readings that no instance owns).
"""

from __future__ import annotations

from gputop.core.model import GpuSample, MigSample, ProcSample


def instance_processes(parent: GpuSample, m: MigSample) -> tuple[ProcSample, ...]:
    return tuple(p for p in parent.processes if p.gpu_instance == m.gpu_instance)


def instance_gpu(parent: GpuSample, m: MigSample, index: int | None = None) -> GpuSample:
    """MIG device ``m`` of ``parent`` as a GpuSample (``index``: the parent's by default)."""
    return GpuSample(
        index=parent.index if index is None else index,
        uuid=m.uuid or parent.uuid,
        name=m.name or parent.name,
        bus_id=parent.bus_id,
        lost=parent.lost,
        mem_used=m.mem_used,
        mem_total=m.mem_total,
        temperature_c=parent.temperature_c,
        sm_clock_mhz=parent.sm_clock_mhz,
        sm_clock_max_mhz=parent.sm_clock_max_mhz,
        mem_clock_mhz=parent.mem_clock_mhz,
        mem_clock_max_mhz=parent.mem_clock_max_mhz,
        clock_events=parent.clock_events,
        pstate=parent.pstate,
        ecc_volatile=parent.ecc_volatile,
        sm_active=m.sm_active,
        sm_occupancy=m.sm_occupancy,
        tensor_active=m.tensor_active,
        dram_active=m.dram_active,
        processes=instance_processes(parent, m),
    )


def instance_label(parent_index: int, m: MigSample) -> str:
    """"GPU 0 MIG 1g.10gb (GI 7)": how a finding names a MIG device."""
    profile = f" {m.profile}" if m.profile else ""
    return f"GPU {parent_index} MIG{profile} (GI {m.gpu_instance})"
