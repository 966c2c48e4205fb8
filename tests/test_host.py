"""collect/host.py and the Sampler on real processes the tests start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from gputop.collect.host import HostCollector
from gputop.collect.nvml import NvmlCollector
from gputop.collect.sampler import Sampler
from gputop.core.snapshot_json import snapshot_to_json
from tests.conftest import SLOW, wait_for

# A parent that forks two children burning CPU, then waits: a DataLoader-shaped tree.
TREE = textwrap.dedent(
    """
    import os, sys, time
    kids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            end = time.time() + 60
            x = 0
            while time.time() < end:
                x += 1
            os._exit(0)
        kids.append(pid)
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def busy_tree(spawn):
    """The tree, ended (parent and children) by ``spawn`` when the test is over."""
    proc = spawn([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_process_tree_with_measured_workers(busy_tree):
    host = HostCollector()
    first = host.sample_process(busy_tree.pid, gpu_mem=123)
    assert first.visible and first.cpu_percent is None  # not measured yet: no baseline
    assert first.gpu_mem == 123
    time.sleep(0.5)
    proc = host.sample_process(busy_tree.pid)
    assert proc.cpu_percent is not None and proc.cpu_percent < 20  # the parent waits
    assert len(proc.workers) == 2
    assert {w.pid for w in proc.workers} == {c.pid for c in psutil.Process(busy_tree.pid).children()}
    # Two burners: each measured well above the waiting parent, however busy the machine is.
    assert all(w.cpu_percent is not None and w.cpu_percent > max(5.0, proc.cpu_percent)
               for w in proc.workers)
    assert proc.user and proc.rss > 0 and proc.threads >= 1 and proc.create_time > 0
    assert "import os" in proc.cmdline


def test_invisible_pid_is_kept_and_marked():
    host = HostCollector()
    with open("/proc/sys/kernel/pid_max") as f:
        impossible = int(f.read()) + 7
    proc = host.sample_process(impossible, gpu_mem=5)
    assert not proc.visible and proc.pid == impossible and proc.gpu_mem == 5
    assert "not visible" in proc.name


def test_exited_process_and_reused_pid_are_not_confused(spawn):
    host = HostCollector()
    child = spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    first = host.sample_process(child.pid)
    assert first.visible
    child.kill()
    child.wait(SLOW)
    gone = host.sample_process(child.pid)
    assert not gone.visible


def test_host_sample_has_rates_after_the_first_call():
    host = HostCollector()
    time.sleep(0.2)
    sample = host.sample_host()
    assert sample.hostname
    assert sample.cpu_count == len(sample.cpu_per_core) == psutil.cpu_count()
    assert 0 <= sample.cpu_percent <= 100
    assert sample.memory_total > sample.memory_used > 0
    assert sample.load_1 is not None and sample.process_count > 10
    assert sample.disk_read_bps is not None and sample.net_rx_bps is not None


def test_cache_forgets_processes_that_are_gone(busy_tree):
    host = HostCollector()
    host.sample_process(busy_tree.pid)
    host.end_tick()
    assert busy_tree.pid in host._tracked
    host.end_tick()  # a tick that did not look at it
    assert busy_tree.pid not in host._tracked


def test_sampler_without_driver_still_samples_the_host(simulated):
    # No driver, whatever this host has: the simulated libnvidia-ml of the `no-driver` scenario
    # answers nvmlInit as a host without the library does (NVML_ERROR_LIBRARY_NOT_FOUND).
    simulated("no-driver")
    sampler = Sampler(NvmlCollector())
    driver = sampler.open()
    assert not driver.available and "not found" in driver.error
    snap = sampler.sample()
    assert snap.gpus == () and snap.host.memory_total > 0
    assert snapshot_to_json(snap)["driver"]["available"] is False


def test_sampler_joins_gpu_pids_with_their_trees(simulated, sim_clock, busy_tree):
    sim = simulated("input-starved")
    sim.set_processes(0, [busy_tree.pid])
    sampler = Sampler(NvmlCollector())
    sampler.open()
    sampler.sample()

    def measured():
        snap = sampler.sample()
        proc = snap.gpus[0].processes[0]
        return snap if all(w.cpu_percent for w in proc.workers) else None

    snap = wait_for(measured, timeout=SLOW, interval=0.3)
    proc = snap.gpus[0].processes[0]
    assert proc.pid == busy_tree.pid and proc.gpu_mem > 0 and proc.sm_util is not None
    assert len(proc.workers) == 2
    data = snapshot_to_json(snap)
    worker = data["gpus"][0]["processes"][0]["workers"][0]
    assert set(worker) >= {"pid", "cpu_percent", "state"}
    sampler.close()
    os.kill(busy_tree.pid, signal.SIGCONT)  # still alive and untouched by sampling
