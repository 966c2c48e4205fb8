"""The live roofline rule on the simulated NVML's GPM activities: memory-bound and
latency-bound GPUs, and none where the work is compute-bound or the GPU is not busy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputop.collect.nvml import NvmlCollector
from gputop.core.model import DriverInfo, HostSample, ProcSample, Snapshot
from gputop.diagnostics.live import evaluate
from gputop.diagnostics.live.roofline import speed_of_light

OWN = 999_999
ROOFLINE_IDS = {"memory-bound", "latency-bound"}


def _proc(pid: int) -> ProcSample:
    return ProcSample(pid=pid, name="python", cpu_percent=30.0, gpu_mem=1 << 30, ppid=1,
                      create_time=-3600.0)


def _history(simulated, sim_clock, scenario: str, seconds: int = 40) -> list[Snapshot]:
    """A snapshot a second from the scenario's simulated driver, each GPU running one training
    process that started long before (past its start-up)."""
    simulated(scenario)
    collector = NvmlCollector(None)
    assert collector.open().available
    out = []
    for t in range(seconds):
        sim_clock.t = float(t)
        gpus = tuple(replace(g, processes=(_proc(100 + g.index),))
                     for g, _, _ in collector.sample())
        out.append(Snapshot(float(t), HostSample("node", cpu_percent=30.0), DriverInfo(True),
                            gpus))
    return out


def test_memory_bound_scenario_raises_memory_bound(simulated, sim_clock):
    history = _history(simulated, sim_clock, "memory-bound")
    compute, memory = speed_of_light(history[-1].gpus[0])
    assert memory > 80 and compute < 10  # GPM's DRAM and tensor activity
    found = [f for f in evaluate(history, own_pid=OWN) if f.id in ROOFLINE_IDS]
    assert [f.id for f in found] == ["memory-bound"]
    f = found[0]
    assert f.gpu == 0 and f.severity == "warning"
    assert "speed of light" in f.evidence and "DRAM" in f.title
    # The memory roof from NVML: the maximum memory clock x the bus width (H100: 3.35 TB/s).
    assert "NVML: max memory clock 2619 MHz x 5120-bit bus" in f.evidence
    assert "3.35 TB/s memory roof" in f.evidence
    assert "torch.compile" in f.fix


@pytest.mark.parametrize("scenario", ["healthy", "launch-bound", "pcie-bound", "host-bound"])
def test_no_roofline_finding_elsewhere(simulated, sim_clock, scenario):
    found = evaluate(_history(simulated, sim_clock, scenario), own_pid=OWN)
    assert not ROOFLINE_IDS & {f.id for f in found}, [f.title for f in found]


def test_busy_gpu_with_idle_sms_is_latency_bound(simulated, sim_clock):
    # The healthy scenario's readings with the SMs mostly idle and neither pipe busy.
    history = [replace(s, gpus=tuple(replace(g, sm_active=12.0, tensor_active=2.0,
                                             dram_active=6.0) for g in s.gpus))
               for s in _history(simulated, sim_clock, "healthy")]
    found = [f for f in evaluate(history, own_pid=OWN) if f.id in ROOFLINE_IDS]
    assert {f.id for f in found} == {"latency-bound"} and len(found) == 4  # each of 4 GPUs
    assert "12%" in found[0].title


def test_bandwidth_roofs_from_nvml_and_the_datasheets():
    from gputop.core.bandwidth import datasheet_bandwidth, nvml_bandwidth

    assert nvml_bandwidth(2619, 5120).bytes_per_s == pytest.approx(3.35e12, rel=0.01)
    assert nvml_bandwidth(None, 5120) is None
    assert datasheet_bandwidth("NVIDIA H200").bytes_per_s == 4.8e12
    # An A100 the name does not size: its memory does (40 GB: 1.555 TB/s, 80 GB: 2.039).
    assert datasheet_bandwidth("NVIDIA A100-PG509-200", 40 << 30).bytes_per_s == 1.555e12
    assert datasheet_bandwidth("NVIDIA A100-PG509-200", 80 << 30).bytes_per_s == 2.039e12
    assert datasheet_bandwidth("Some GPU") is None
