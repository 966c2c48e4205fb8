"""`gputop analyze` on real CUDA traces recorded on an H200 (tests/data/h200/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

DATA = Path(__file__).parent / "data" / "h200"
GIB = 1 << 30


def analyze(name: str) -> dict:
    result = run_cli("analyze", "--json", str(DATA / f"{name}.pt.trace.json.gz"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def ids(report: dict) -> list[str]:
    return [f["id"] for f in report["findings"]]


@pytest.mark.parametrize("name", ["copy_h2d", "capture_pcie"])
def test_a_step_bounded_by_host_to_device_copies_is_copy_bound_with_bytes_and_rate(name):
    report = analyze(name)
    assert report["verdict"] == "copy-bound", report["verdict"]
    h2d = report["metrics"]["busy"]["classes"]["h2d"]
    steps = report["metrics"]["steps"]["count"]
    assert h2d["bytes"] == steps * GIB  # 1 GiB a step, as the job copies
    link = report["metrics"]["busy"]["link"]
    assert link["name"] == "PCIe Gen5 x16" and link["gb_per_s"] == pytest.approx(63.0, abs=0.1)
    # A pinned copy on a Gen5 x16 link runs near its peak, never above it.
    assert 40 < h2d["gb_per_s"] <= link["gb_per_s"]
    finding = report["findings"][0]
    assert "GB/s" in finding["evidence"] and "GiB" in finding["evidence"]


def test_device_to_host_copies_that_take_a_third_of_the_step_are_named():
    report = analyze("copy_d2h")
    assert "copy-bound" in ids(report)
    d2h = report["metrics"]["busy"]["classes"]["d2h"]
    assert d2h["bytes"] == report["metrics"]["steps"]["count"] * 2 * 8192 * 8192 * 4
    assert 0.2 < d2h["pct"] / 100 < 0.5


def test_a_final_read_on_a_busy_gpu_is_no_host_sync():
    report = analyze("final_read")
    assert report["verdict"] == "healthy", report["verdict"]
    assert "host-sync" not in ids(report)


@pytest.mark.parametrize("name", ["compiled", "capture_tinykernels"])
def test_tiny_kernels_eager_or_compiled_are_launch_bound(name):
    assert analyze(name)["verdict"] == "launch-bound"


def test_a_starved_resnet_is_a_dataloader_stall():
    assert analyze("capture_starved")["verdict"] == "dataloader-stall"
