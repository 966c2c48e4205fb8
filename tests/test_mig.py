"""MIG as first-class devices (issue 29, acceptance 3 and 4): the simulated H100 in MIG mode
with seven 1g.10gb instances, read through nvidia-ml-py's real MIG calls; its instances in
`snapshot`, the exporter (dcgm-exporter's GPU_I_ID / GPU_I_PROFILE labels), the live monitor,
and the live rules; "n/a (MIG)" where the driver gives no per-process reading, never 0."""

from __future__ import annotations

import asyncio
import ctypes
import json
import subprocess
import sys
import time
from dataclasses import replace

import pynvml
import pytest

from gputop.collect.host import HostCollector
from gputop.collect.nvml import NvmlCollector
from gputop.collect.sampler import Sampler
from gputop.core.process_info import NA_MIG
from gputop.diagnostics.live.mig import LiveDiagnosis
from gputop.sim.scenarios import A100, H100_MIG_7X1G, SCENARIOS, GpuBehaviour, Scenario
from tests.conftest import REPO, SLOW, cli_env, run_cli, wait_for
from tests.test_exporter import free_port, scrape

GIB = 1024**3


def test_the_bindings_mig_calls_answer_as_on_a_mig_h100(simulated):
    """nvidia-ml-py's own MIG functions over the simulated library."""
    simulated("mig")
    pynvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
        with pytest.raises(pynvml.NVMLError):  # MIG mode: no utilization for the GPU
            pynvml.nvmlDeviceGetUtilizationRates(gpu)
        seen = []
        for slot in range(7):
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
            assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            assert ctypes.cast(parent, ctypes.c_void_p).value == ctypes.cast(gpu, ctypes.c_void_p).value
            assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
            assert pynvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
            memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
            assert 9.5 * GIB < memory.total < 10.5 * GIB and memory.used <= memory.total
            with pytest.raises(pynvml.NVMLError) as refused:
                pynvml.nvmlDeviceGetUtilizationRates(mig)
            assert refused.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
            seen.append((pynvml.nvmlDeviceGetGpuInstanceId(mig),
                         pynvml.nvmlDeviceGetComputeInstanceId(mig)))
        assert seen == [(gi, 0) for gi in range(7, 14)]
    finally:
        pynvml.nvmlShutdown()


def test_boards_without_mig_mode_say_so(simulated):
    simulated("tour")  # GPU 0: an A100 with MIG off; GPU 6: an L40S, which has no MIG
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == [0, 0]
        with pytest.raises(pynvml.NVMLError) as refused:
            pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(6))
        assert refused.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    finally:
        pynvml.nvmlShutdown()


def test_snapshot_lists_seven_instances_with_memory_processes_and_activity():
    done = run_cli("--demo", "mig", "snapshot", "--json")
    assert done.returncode == 0, done.stderr
    gpu = json.loads(done.stdout)["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["mig_mode"] is True
    assert gpu["util_gpu"] is None  # NVML reports none in MIG mode: null, never 0
    instances = gpu["mig"]
    assert [m["gpu_instance"] for m in instances] == list(range(7, 14))
    assert {m["profile"] for m in instances} == {"1g.10gb"}
    for m in instances:
        assert 9.5 * GIB < m["mem_total"] < 10.5 * GIB and 0 <= m["mem_used"] <= m["mem_total"]
        assert m["sm_active"] is not None  # GPM per GPU instance (Hopper)
    busy = {m["gpu_instance"]: m for m in instances}
    assert busy[7]["sm_active"] > 50 and busy[11]["sm_active"] == 0 and not busy[11]["pids"]
    procs = {p["pid"]: p for p in gpu["processes"]}
    on_instances = {pid: m["gpu_instance"] for m in instances for pid in m["pids"]}
    assert len(on_instances) == 5 and set(on_instances) == set(procs)
    for pid, gi in on_instances.items():
        assert procs[pid]["gpu_instance"] == gi and procs[pid]["compute_instance"] == 0
        assert procs[pid]["sm_util"] is None  # the driver refuses it on MIG
    hidden = [p for p in procs.values() if p["gpu_instance"] == 9]
    assert hidden and hidden[0]["gpu_mem"] is None  # NVML_VALUE_NOT_AVAILABLE


def test_the_text_says_n_a_mig_never_0():
    done = run_cli("--demo", "mig", "snapshot")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [line for line in lines if "MIG GI" in line]
    assert len(rows) == 5
    procs = [lines[lines.index(row) - 1] for row in rows]
    header = next(line for line in lines if "GPU MEM" in line)
    sm_end = header.index(" SM ") + 3
    for line in procs:
        assert line[sm_end - 9:sm_end] == NA_MIG, line  # the SM cell of every MIG process
    assert sum(line.count(NA_MIG) for line in lines) == 6  # 5 SM cells, 1 GPU memory cell
    assert sum(line.strip().startswith("GI ") for line in lines) == 7


def test_exporter_labels_each_instance_with_gpu_i_id_and_profile(spawn):
    port = free_port()
    spawn([sys.executable, "-m", "gputop", "--demo", "mig", "--interval", "0.5", "exporter",
           "--listen", f"127.0.0.1:{port}"], env=cli_env(), cwd=REPO,
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def instances():
        try:
            families = scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return None
        samples = [s for f in families for s in f.samples]
        mem = [s for s in samples if s.name == "gputop_gpu_memory_used_bytes"
               and s.labels["GPU_I_ID"]]
        return samples if len(mem) == 7 else None

    samples = wait_for(instances, timeout=SLOW, interval=0.5)
    mem = {s.labels["GPU_I_ID"]: s for s in samples
           if s.name == "gputop_gpu_memory_used_bytes" and s.labels["GPU_I_ID"]}
    assert set(mem) == {str(gi) for gi in range(7, 14)}
    for s in mem.values():
        assert s.labels["GPU_I_PROFILE"] == "1g.10gb" and s.labels["gpu"] == "0"
        # As dcgm-exporter: the board's model and UUID, the instance in GPU_I_*.
        assert s.labels["model_name"] == "NVIDIA H100 80GB HBM3"
        assert s.labels["UUID"].startswith("GPU-")
    sm = [s for s in samples if s.name == "gputop_gpu_sm_active_ratio" and s.labels["GPU_I_ID"]]
    assert len(sm) == 7
    # No utilization series for a MIG device (NVML has none), nor for the board in MIG mode.
    assert not [s for s in samples if s.name == "gputop_gpu_utilization_percent"]
    whole = [s for s in samples if s.name == "gputop_gpu_power_usage_watts"]
    assert len(whole) == 1 and whole[0].labels["GPU_I_ID"] == ""


def test_the_live_monitor_shows_the_instances_and_n_a_mig_cells():
    from gputop.tui.monitor.app import GputopApp
    from tests.tui_data import screen_text

    async def run() -> str:
        app = GputopApp(demo="mig", interval=0.5)
        async with app.run_test(size=(160, 50)) as pilot:
            # The MIG GPU's five processes (agents of other jobs on this machine may be
            # listed too, without a GPU: not ours to check).
            def mine() -> list[str]:
                snap = app.frame.snapshot if app.frame is not None else None
                keys = [str(p.pid) for p in snap.gpus[0].processes] if snap else []
                return [k for k in keys if k in app.table.rows]

            deadline = time.monotonic() + SLOW
            while len(mine()) < 5 and time.monotonic() < deadline:
                await pilot.pause(0.2)
            await pilot.pause(0.5)
            cells = [(app.table.get_cell(key, "gpu_mem").plain.strip(),
                      app.table.get_cell(key, "sm").plain.strip()) for key in mine()]
            assert len(cells) == 5
            text = screen_text(app)
            await pilot.press("q")
        assert all(sm == NA_MIG for _, sm in cells), cells
        assert sum(mem == NA_MIG for mem, _ in cells) == 1
        return text

    text = asyncio.run(run())
    assert "MIG: 7 devices" in text
    for gi in range(7, 14):
        assert f"GI {gi:>2} 1g.10gb" in text
    assert "SM  0%" not in text.split("GI  7")[1].split("\n")[0]  # GI 7 is busy


def _sleepers(spawn, n: int) -> list[int]:
    procs = [spawn([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(n)]
    return [p.pid for p in procs]


def test_live_rules_judge_each_instance(simulated, sim_clock, spawn):
    """The leaking instance (GI 8) raises memory-growth for that MIG device alone, named as
    such; its neighbours on the same board stay quiet."""
    sim = simulated("mig")
    sim.set_processes(0, _sleepers(spawn, 5))
    sampler = Sampler(NvmlCollector(), HostCollector(), clock=lambda: 1e6 + sim_clock.t,
                      nvml_pids_local=True)
    sampler.open()
    diagnosis = LiveDiagnosis()
    raised = []
    try:
        for step in range(0, 160):
            sim_clock.t = step * 0.5
            raised += [t.finding for t in diagnosis.update(sampler.sample())
                       if t.state == "raised"]
    finally:
        sampler.close()
    growth = [f for f in raised if f.id == "memory-growth"]
    assert [(f.gpu, f.gpu_instance) for f in growth] == [(0, 8)]
    assert growth[0].title == "GPU 0 MIG 1g.10gb (GI 8) memory rising steadily"
    assert growth[0].to_json()["gpu_instance"] == 8
    assert all(f.gpu_instance is not None for f in raised if f.gpu == 0 and f.id != "hardware-errors")


def test_without_gpm_an_instance_activity_is_n_a_not_0(simulated):
    """An A100 in MIG mode has no GPM: its MIG devices' activity is unknown, and says so."""
    SCENARIOS["a100-mig-test"] = Scenario("a100-mig-test", "A100 in MIG mode", (
        GpuBehaviour("healthy", A100, "trainer",
                     mig=tuple(replace(m, mem_total=10 * GIB) for m in H100_MIG_7X1G)),))
    try:
        simulated("a100-mig-test")
        collector = NvmlCollector()
        collector.open()
        sample, _, _ = collector.sample()[0]
        collector.close()
    finally:
        del SCENARIOS["a100-mig-test"]
    assert sample.mig_mode and len(sample.mig) == 7
    assert all(m.sm_active is None and m.mem_used is not None for m in sample.mig)
    from gputop.tui.widgets.mig_cards import mig_line

    text = "".join(piece for piece, _ in mig_line(sample.mig[0]))
    assert "SM  n/a" in text and "0%" not in text
