"""`gputop snapshot` end to end: the acceptance commands of the sampling core."""

from __future__ import annotations

import json

import psutil

from tests.conftest import run_cli

SCHEMA_GPU = ["index", "uuid", "name", "lost", "util_gpu", "util_mem", "mem_used", "mem_total",
              "power_w", "power_limit_w", "energy_j", "pcie_tx_mbs", "pcie_rx_mbs",
              "temperature_c", "sm_clock_mhz", "sm_clock_max_mhz", "clock_events", "sm_active",
              "tensor_active", "processes"]
SCHEMA_PROC = ["pid", "name", "gpu_mem", "sm_util", "cpu_percent", "rss", "workers"]
SCHEMA_HOST = ["hostname", "cpu_percent", "cpu_per_core", "memory_used", "memory_total"]


def snapshot_json(*args: str) -> dict:
    result = run_cli(*args, "snapshot", "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_healthy_json_has_every_key():
    data = snapshot_json("--demo", "healthy")
    assert data["driver"]["available"] is True
    assert data["driver"]["driver_version"] and data["driver"]["cuda_version"]
    assert set(SCHEMA_HOST) <= set(data["host"])
    gpu = data["gpus"][0]
    assert set(SCHEMA_GPU) <= set(gpu)
    for key in ("util_gpu", "mem_used", "mem_total", "power_w", "power_limit_w", "energy_j",
                "pcie_rx_mbs", "temperature_c", "sm_clock_mhz", "sm_active", "tensor_active"):
        assert gpu[key] is not None, key
    proc = gpu["processes"][0]
    assert set(SCHEMA_PROC) <= set(proc)


def test_without_measure_cpu_shares_come_from_counters_already_there():
    """No wait for a second reading: every process and worker has a CPU share (its average
    since it started), and the host's is measured over the command's own run."""
    data = snapshot_json("--demo", "healthy")
    assert data["host"]["cpu_percent"] is not None
    procs = [p for g in data["gpus"] for p in g["processes"] if p["visible"]]
    assert procs
    for proc in procs:
        assert proc["cpu_percent"] is not None and proc["cpu_percent"] >= 0
        assert proc["workers"] and all(w["cpu_percent"] is not None for w in proc["workers"])


def test_input_starved_lists_a_live_pid_with_measured_workers():
    # --measure 1: rates over one second, as `top` shows them (the stand-ins start with the
    # command, so their averages since they started would mostly be their start-up).
    result = run_cli("--demo", "input-starved", "snapshot", "--json", "--measure", "1")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    proc = data["gpus"][0]["processes"][0]
    assert proc["workers"], proc
    for worker in proc["workers"]:
        assert worker["cpu_percent"] is not None and worker["cpu_percent"] >= 0  # measured
        assert worker["state"]
    # Busy: CPU-bound workers want a CPU the whole second, whatever share of one a loaded
    # host gives them; the kernel books that time as running or as waiting in a run queue.
    wait = proc["cpu_wait"]
    assert wait["run_s"] + wait["wait_s"] >= 0.5 * len(proc["workers"]), wait
    # The stand-ins end with the command: the pids are real but gone now.
    assert not psutil.pid_exists(proc["pid"]) or psutil.Process(proc["pid"]).status() == "zombie"


def test_unsupported_board_has_nulls_and_the_rest():
    data = snapshot_json("--demo", "unsupported")
    gpu = data["gpus"][0]
    assert gpu["power_w"] is None and gpu["pcie_rx_mbs"] is None and gpu["sm_active"] is None
    assert gpu["util_gpu"] is not None and gpu["mem_used"] is not None
    assert gpu["processes"][0]["pid"] > 0  # found through the older _v2 call


def test_no_driver_is_one_line_and_the_host_part():
    # `--demo no-driver`: no driver whatever this host has (a GPU node has one), through the
    # same path as a host without libnvidia-ml (nvmlInit: NVML_ERROR_LIBRARY_NOT_FOUND).
    result = run_cli("--demo", "no-driver", "snapshot")
    assert result.returncode == 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVIDIA driver" in lines[0] and "--demo" in lines[0]
    assert "CPU" in result.stdout and "mem" in result.stdout


def test_unknown_scenario_exits_2_with_one_line():
    result = run_cli("--demo", "nonsense", "snapshot")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "healthy" in lines[0] and "tour" in lines[0] and "nonsense" in lines[0]


def test_demo_list_names_every_scenario():
    from gputop.sim.scenarios import SCENARIOS

    result = run_cli("--demo", "list")
    assert result.returncode == 0
    # Every node scenario, then `fleet` (simulated nodes on the fleet screen, not a node's).
    assert [line.split()[0] for line in result.stdout.splitlines()] == [*SCENARIOS, "fleet"]


def test_table_shows_gpus_and_worker_rows():
    result = run_cli("--demo", "tour", "--gpus", "0,6", "snapshot")
    assert result.returncode == 0, result.stderr
    assert "A100-SXM4-80GB" in result.stdout and "L40S" in result.stdout
    assert "H100" not in result.stdout  # filtered out
    assert "(worker)" in result.stdout


def test_bad_global_options_are_one_line_errors():
    for args in (["--gpus", "a,b"], ["--interval", "0"]):
        result = run_cli(*args, "snapshot")
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1
