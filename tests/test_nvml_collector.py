"""collect/nvml.py through the simulated NVML, in every scenario and fault."""

from __future__ import annotations

import json
import os
from dataclasses import fields

import pytest

from gputop.collect.nvml import SLOW_EVERY, NvmlCollector, decode_clock_events
from gputop.core.model import GpuSample
from gputop.sim import nvml as simnvml
from gputop.sim.scenarios import SCENARIOS, reading

BASICS = ("util_gpu", "util_mem", "mem_used", "mem_total", "power_w", "power_limit_w", "energy_j",
          "pcie_tx_mbs", "pcie_rx_mbs", "temperature_c", "sm_clock_mhz", "sm_clock_max_mhz")


def open_collector(only=None) -> tuple[NvmlCollector, object]:
    collector = NvmlCollector(only)
    driver = collector.open()
    return collector, driver


def test_healthy_reports_every_field(simulated, sim_clock):
    simulated("healthy")
    collector, driver = open_collector()
    assert driver.available and driver.driver_version == "570.133.20"
    assert driver.cuda_version == "12.8"
    sim_clock.t = 5.0
    collector.sample()
    sim_clock.t = 6.0
    rows = collector.sample()
    assert len(rows) == 4
    gpu = rows[0][0]
    for name in BASICS:
        assert getattr(gpu, name) is not None, name
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.bus_id.startswith("00000000:")
    assert gpu.mem_reserved > 0  # the v2 memory call was used
    assert 90 <= gpu.util_gpu <= 100
    assert 0 < gpu.power_w <= gpu.power_limit_w == 700.0
    assert gpu.pcie_gen == gpu.pcie_gen_max == 5
    # GPM (Hopper) gives rates between two samples: present on the second tick.
    assert gpu.sm_active is not None and gpu.tensor_active is not None
    assert gpu.fan_percent is None  # SXM boards have no fan of their own
    collector.close()


def test_energy_counter_is_monotonic(simulated, sim_clock):
    simulated("healthy")
    collector, _ = open_collector()
    readings = []
    for t in (1.0, 2.0, 5.0):
        sim_clock.t = t
        readings.append(collector.sample()[0][0].energy_j)
    assert readings[0] < readings[1] < readings[2]
    # About the power draw times the elapsed time (600 W-ish for 3 s).
    assert 1000 < readings[2] - readings[1] < 3 * 700


def test_same_seed_same_readings_other_seed_differs(simulated, sim_clock):
    def utilizations(seed: int) -> list[float]:
        simulated("tour", seed=seed)
        collector, _ = open_collector()
        out = []
        for t in range(10):
            sim_clock.t = float(t)
            out.extend(g.util_gpu for g, _, _ in collector.sample() if not g.lost)
        collector.close()
        return out

    assert utilizations(3) == utilizations(3)
    assert utilizations(3) != utilizations(4)


def test_unsupported_fields_are_none_and_not_retried(simulated, sim_clock):
    sim = simulated("unsupported")
    sim.set_processes(0, [os.getpid()])
    collector, driver = open_collector()
    assert driver.cuda_version == "11.4"
    rows = collector.sample()
    gpu = rows[0][0]
    for name in ("power_w", "power_limit_w", "energy_j", "pcie_tx_mbs", "pcie_rx_mbs", "sm_active",
                 "tensor_active"):
        assert getattr(gpu, name) is None, name
    assert gpu.util_gpu is not None and gpu.mem_used is not None and gpu.temperature_c is not None
    # Missing versioned symbols fell back to the older calls.
    assert gpu.mem_reserved is None  # nvmlDeviceGetMemoryInfo (v1)
    assert rows[0][1] and rows[0][1][0][0] == os.getpid()  # _v2 processes after the mismatch
    # The older throttle-reasons call answered: at t=0 the job starts up, the GPU idles.
    assert gpu.clock_events == ("gpu_idle",)
    assert rows[0][2] == {}  # no per-process utilization on this board
    before = dict(sim.calls)
    for t in range(1, 4):
        sim_clock.t = float(t)
        collector.sample()
    after = sim.calls
    # The capability cache: refused calls are not repeated every tick.
    for name in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput",
                 "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetCurrentClocksEventReasons"):
        assert after[name] == before.get(name, 0), name
    # ... while supported ones are called every tick (2 GPUs x 3 ticks).
    assert after["nvmlDeviceGetUtilizationRates"] - before["nvmlDeviceGetUtilizationRates"] == 6
    assert after["nvmlDeviceGetComputeRunningProcesses_v2"] > before["nvmlDeviceGetComputeRunningProcesses_v2"]


def test_missing_symbol_is_absent_from_the_library(simulated):
    simulated("unsupported")
    import pynvml

    assert not hasattr(pynvml.nvmlLib, "nvmlDeviceGetComputeRunningProcesses_v3")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    pynvml.nvmlShutdown()


def test_gpu_lost_marks_one_gpu_and_the_others_carry_on(simulated, sim_clock):
    simulated("gpu-lost")
    collector, _ = open_collector()
    sim_clock.t = 2.0
    assert not any(g.lost for g, _, _ in collector.sample())
    sim_clock.t = 6.0  # errors start to show before the loss (read every SLOW_EVERY ticks)
    rows = [collector.sample() for _ in range(SLOW_EVERY)]
    assert rows[-1][2][0].ecc_volatile > 0
    sim_clock.t = 9.0
    rows = collector.sample()
    lost = [g for g, _, _ in rows if g.lost]
    assert [g.index for g in lost] == [2]
    assert lost[0].name == "NVIDIA A100-SXM4-80GB" and lost[0].util_gpu is None
    assert all(g.util_gpu is not None for g, _, _ in rows if not g.lost)
    sim_clock.t = 10.0
    assert [g.index for g, _, _ in collector.sample() if g.lost] == [2]


def test_no_driver_is_a_state_not_an_error(simulated):
    simulated("no-driver")
    collector, driver = open_collector()
    assert not driver.available
    assert "not available" in driver.error
    assert collector.sample() == []
    collector.close()


def test_real_library_is_a_driver_or_a_one_line_state():
    """The real libnvidia-ml, whatever this host has: a driver on a GPU node, else a state
    (here the library is usually absent; `no-driver` above forces that case anywhere)."""
    simnvml.uninstall()
    collector, driver = open_collector()
    try:
        if driver.available:
            assert driver.driver_version and driver.error is None
        else:
            assert "NVIDIA driver" in driver.error and "\n" not in driver.error
            assert collector.sample() == []
    finally:
        collector.close()


def test_gpu_filter(simulated):
    simulated("tour")
    collector, _ = open_collector(only=[0, 2])
    assert [g.index for g, _, _ in collector.sample()] == [0, 2]


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "no-driver"])
def test_every_scenario_samples_for_a_minute(simulated, sim_clock, name):
    simulated(name)
    collector, driver = open_collector()
    assert driver.available
    for t in range(0, 61, 5):
        sim_clock.t = float(t)
        rows = collector.sample()
        assert len(rows) == len(SCENARIOS[name].gpus)
        for gpu, _, _ in rows:
            assert isinstance(gpu, GpuSample)
            if gpu.mig_mode:  # NVML reports no utilization in MIG mode: n/a, never 0
                assert gpu.util_gpu is None and gpu.mig
            elif not gpu.lost:
                assert 0 <= gpu.util_gpu <= 100
            if not gpu.lost:
                assert 0 < gpu.mem_used <= gpu.mem_total
    collector.close()


def test_scenario_signals(simulated, sim_clock):
    """Each problem shows in the readings the way it shows on a real GPU."""
    simulated("tour")
    collector, _ = open_collector()
    series: dict[int, list[GpuSample]] = {}
    for step in range(0, 120):
        sim_clock.t = 30 + step * 0.25
        for gpu, _, _ in collector.sample():
            series.setdefault(gpu.index, []).append(gpu)

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values)

    assert mean(g.util_gpu for g in series[0]) < 10  # input-starved (H200: 2-4 %)
    sync = [g.util_gpu for g in series[1]]
    assert max(sync) > 80 and min(sync) < 10  # host-sync: busy, then idle at each sync
    assert all("sw_power_cap" in g.clock_events for g in series[2])  # throttled
    assert series[2][0].sm_clock_mhz < 0.8 * series[2][0].sm_clock_max_mhz
    assert series[3][-1].mem_used > series[3][0].mem_used  # memory-leak
    # pcie-bound: the link near its rate, utilization near 100 % (copies count), SMs idle.
    pcie = series[4]
    link = 3.938 * 16 * 1000  # Gen5 x16, MB/s per direction
    assert mean(g.pcie_rx_mbs for g in pcie) > 0.85 * link
    assert mean(g.util_gpu for g in pcie) > 90 and mean(g.sm_active for g in pcie) < 5
    healthy = series[5]
    assert mean(g.util_gpu for g in healthy) > 90  # healthy: SM activity ~80 % of it
    assert 0.7 < mean(g.sm_active for g in healthy) / mean(g.util_gpu for g in healthy) < 0.9
    assert mean(g.util_gpu for g in series[6]) == 0 and series[6][0].mem_used > 0  # idle
    assert series[7][-1].lost  # lost after 20 s
    # host-bound: mostly idle, the kernels that run not tiny; tiny kernels: SMs < 1 %.
    host = series[8]
    assert mean(g.util_gpu for g in host) < 20
    assert mean(g.sm_active for g in host) / mean(g.util_gpu for g in host) > 0.2
    tiny = series[9]
    assert 10 < mean(g.util_gpu for g in tiny) < 30 and mean(g.sm_active for g in tiny) < 1


def test_every_job_starts_up_first(simulated, sim_clock):
    """Like a real job (H200: 6-7 s before the first step), each simulated GPU first idles
    while its memory fills: the context, the model built and copied."""
    from gputop.sim.scenarios import STARTUP_S

    simulated("tour")
    collector, _ = open_collector()
    early = []
    for step in range(int(STARTUP_S * 4)):
        sim_clock.t = step * 0.25
        early.append(collector.sample())
    sim_clock.t = STARTUP_S + 1
    later = collector.sample()
    for rows in early:
        assert all(g.util_gpu == 0 and not g.sm_active for g, _, _ in rows)
    mem = [[g.mem_used for g, _, _ in rows] for rows in early]
    assert all(a < b for a, b in zip(mem[0], mem[-1]))
    assert mean_util(later) > 10


def mean_util(rows) -> float:
    return sum(g.util_gpu for g, _, _ in rows) / len(rows)


def test_decode_clock_events():
    assert decode_clock_events(0) == ()
    assert decode_clock_events(0x4 | 0x40) == ("sw_power_cap", "hw_thermal")


def test_gpu_sample_fields_match_the_public_schema():
    names = {f.name for f in fields(GpuSample)}
    for key in ("index", "uuid", "name", "lost", "util_gpu", "util_mem", "mem_used", "mem_total",
                "power_w", "power_limit_w", "energy_j", "pcie_tx_mbs", "pcie_rx_mbs",
                "temperature_c", "sm_clock_mhz", "sm_clock_max_mhz", "clock_events", "sm_active",
                "tensor_active", "processes"):
        assert key in names


def test_pcie_is_read_once_per_tick_on_helper_threads_all_gpus_at_once(sim_clock):
    """The driver takes 20 ms per PCIe counter: a tick reads every GPU's TX and RX once, on
    helper threads that run together (a read waits here until another one is in flight)."""
    import threading
    import time

    from tests.conftest import SLOW

    class Overlapping(simnvml.SimulatedNvml):
        lock = threading.Lock()
        in_flight = most = 0
        threads: set[str] = set()

        def nvmlDeviceGetPcieThroughput(self, handle, counter, out):
            with self.lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                self.threads.add(threading.current_thread().name)
            deadline = time.monotonic() + SLOW
            while self.most < 2 and time.monotonic() < deadline:
                time.sleep(0.001)  # sequential reads would never see a second one
            try:
                return super().nvmlDeviceGetPcieThroughput(handle, counter, out)
            finally:
                with self.lock:
                    self.in_flight -= 1

    sim = simnvml.install(Overlapping(SCENARIOS["tour"], clock=sim_clock))
    try:
        collector, _ = open_collector()
        rows = collector.sample()
        assert sim.most >= 2
        assert sim.threads and all(t.startswith("gputop-pcie") for t in sim.threads)
        live = [g for g, _, _ in rows if not g.lost]
        assert sim.calls["nvmlDeviceGetPcieThroughput"] == 2 * len(live)  # TX and RX, once
        assert all(g.pcie_rx_mbs is not None and g.pcie_tx_mbs is not None for g in live)
        collector.close()
    finally:
        simnvml.uninstall()


def test_after_the_first_tick_the_readers_read_their_shares_of_the_gpus(sim_clock):
    """From the second tick, each reader thread reads its share of the GPUs as one task (the
    tick waits once per reader, not once per GPU): every live GPU without GPM (the tour's 2
    A100s and 2 L40Ss; its H100s count PCIe in GPM) has its TX and RX read once a tick, on the
    readers, with a GPU that falls off the bus in a share named lost."""
    import threading

    class Recorded(simnvml.SimulatedNvml):
        threads: set[str] = set()

        def nvmlDeviceGetPcieThroughput(self, handle, counter, out):
            self.threads.add(threading.current_thread().name)
            return super().nvmlDeviceGetPcieThroughput(handle, counter, out)

    sim = simnvml.install(Recorded(SCENARIOS["tour"], clock=sim_clock))  # 10 GPUs: 2 readers
    try:
        collector, _ = open_collector()
        collector.sample()  # the first tick: every GPU on its own thread
        for t in (1.0, 2.0, 3.0):
            sim_clock.t = t
            sim.threads.clear()
            before = sim.calls["nvmlDeviceGetPcieThroughput"]
            rows = collector.sample()
            live = [g for g, _, _ in rows if not g.lost]
            legacy = [g for g in live if "H100" not in g.name]
            assert sim.calls["nvmlDeviceGetPcieThroughput"] - before == 2 * len(legacy) == 8
            assert all(g.pcie_rx_mbs is not None and g.pcie_tx_mbs is not None for g in live)
            assert len(sim.threads) <= 2 and all(n.startswith("gputop-pcie") for n in sim.threads)
        sim.gpu_faults[1] = simnvml.GPU_IS_LOST  # GPU 1 shares a reader with 7 (0 and 6: the other)
        sim_clock.t = 4.0
        rows = collector.sample()
        assert [g.index for g, _, _ in rows if g.lost] == [1]
        assert all(g.pcie_rx_mbs is not None for g, _, _ in rows if g.index in (0, 6, 7))
        collector.close()
    finally:
        simnvml.uninstall()


def test_a_gpu_whose_handle_turns_invalid_is_lost_and_raises_hardware_errors(simulated,
                                                                            sim_clock):
    """Mid-run, every call on GPU 1's handle answers INVALID_ARGUMENT (not GPU_IS_LOST): it is
    shown LOST, the others carry on, and the live rules raise hardware-errors for it."""
    from gputop.collect.host import HostCollector
    from gputop.collect.sampler import Sampler
    from gputop.diagnostics.live import LiveDiagnosis

    sim = simulated("healthy")
    sampler = Sampler(NvmlCollector(), HostCollector(), clock=sim_clock)
    sampler.open()
    diagnosis = LiveDiagnosis()
    transitions = []
    try:
        for t in range(30):
            sim_clock.t = float(t)
            if t == 10:
                sim.gpu_faults[1] = simnvml.INVALID_ARGUMENT
            snap = sampler.sample()
            transitions += diagnosis.update(snap)
            lost = [g.index for g in snap.gpus if g.lost]
            assert lost == ([] if t < 10 else [1]), (t, lost)
    finally:
        sampler.close()
    gone = snap.gpus[1]
    assert gone.name == "NVIDIA H100 80GB HBM3" and gone.util_gpu is None
    from gputop.commands.snapshot import format_snapshot

    shown = format_snapshot(snap).splitlines()
    assert [line.split()[0] for line in shown if "LOST" in line] == ["[1]"], shown
    assert all(g.util_gpu is not None for g in snap.gpus if g.index != 1)
    raised = [tr.finding for tr in transitions if tr.state == "raised"]
    assert [(f.id, f.gpu) for f in raised] == [("hardware-errors", 1)], raised
    assert any(f.id == "hardware-errors" and f.gpu == 1 for f in diagnosis.findings())


def test_a_query_that_does_not_apply_is_not_a_lost_gpu(simulated, sim_clock):
    """INVALID_ARGUMENT from one query on a GPU whose handle still works (a sensor the board
    lacks) marks that field unsupported, not the GPU lost."""
    sim = simulated("healthy")
    sim.call_faults["nvmlDeviceGetTemperature"] = simnvml.INVALID_ARGUMENT
    collector, _ = open_collector()
    rows = collector.sample()
    assert not any(g.lost for g, _, _ in rows)
    assert all(g.temperature_c is None and g.util_gpu is not None for g, _, _ in rows)
    collector.close()


def test_snapshot_says_why_no_gpu_is_listed_and_never_driver_none(simulated, capsys):
    """The driver answers but cannot count its GPUs, and has no version to give: the snapshot
    says why there is no GPU section, and shows the version as n/a."""
    from gputop.cli import main

    sim = simulated("healthy")
    sim.call_faults["nvmlDeviceGetCount_v2"] = simnvml.NOT_SUPPORTED
    sim.call_faults["nvmlSystemGetDriverVersion"] = simnvml.NOT_SUPPORTED
    assert main(["snapshot"]) == 0
    out = capsys.readouterr().out
    assert "driver n/a" in out and "driver None" not in out, out
    assert ("no GPUs: the driver did not count its GPUs (nvmlDeviceGetCount: Not Supported)"
            in out), out
    assert main(["snapshot", "--json"]) == 0
    driver = json.loads(capsys.readouterr().out)["driver"]
    assert driver["available"] and "Not Supported" in driver["error"]


def test_a_gpu_whose_gpm_counts_pcie_is_not_read_with_the_blocking_calls(sim_clock):
    """A Hopper GPU's GPM counts PCIe traffic in MiB/s between its two samples (nvml.h): from
    the second tick its TX and RX come from there, in MB/s as the legacy KB/s read gives them,
    without nvmlDeviceGetPcieThroughput (20 ms of blocking per direction). Where its GPM stops
    answering, the next tick reads PCIe the legacy way again."""

    class Counted(simnvml.SimulatedNvml):
        read: list[int] = []
        gpm_off = False

        def nvmlDeviceGetPcieThroughput(self, handle, counter, out):
            self.read.append(self._field(handle, None)[0])
            return super().nvmlDeviceGetPcieThroughput(handle, counter, out)

        def nvmlGpmSampleGet(self, handle, sample):
            if self.gpm_off:
                return simnvml.NOT_SUPPORTED
            return super().nvmlGpmSampleGet(handle, sample)

    sim = simnvml.install(Counted(SCENARIOS["tour"], clock=sim_clock))
    try:
        collector, _ = open_collector([4])  # the tour's pcie-bound H100
        collector.sample()
        sim.read.clear()
        sim_clock.t = 1.0
        gpu = collector.sample()[0][0]
        want = reading(SCENARIOS["tour"].gpus[4], 4, 1.0, 0)
        assert sim.read == []
        # GPM's readings are kept to 0.01 MiB/s (0.0105 MB/s).
        assert gpu.pcie_rx_mbs == pytest.approx(want.pcie_rx_kbs / 1000, abs=0.011)
        assert gpu.pcie_tx_mbs == pytest.approx(want.pcie_tx_kbs / 1000, abs=0.011)
        sim.gpm_off = True  # GPM refuses from now on
        sim_clock.t = 2.0
        collector.sample()  # its GPM reading fails: no PCIe from it this tick
        sim_clock.t = 3.0
        gpu = collector.sample()[0][0]
        assert sim.read == [4, 4]  # TX and RX, the legacy way
        assert gpu.pcie_rx_mbs is not None and gpu.pcie_tx_mbs is not None
        collector.close()
    finally:
        simnvml.uninstall()
