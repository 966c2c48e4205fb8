"""The device's busy time by class (compute, copies by direction, memsets, communication), the
``copy-bound`` finding, and reads at the end of a window that cost nothing.

Copies and CUDA kernels cannot come from a CPU-only torch, so these traces are written event by
event in Kineto's own schema (tests/kineto_trace.py); the real GPU traces of ../shared/traces
check the same figures where they have copies.
"""

from __future__ import annotations

import json

import pytest

from gputop.core.pcie import pcie_gb_per_s
from gputop.diagnostics.trace.analysis import analyze_trace
from gputop.diagnostics.trace.measuring.links import host_link
from tests.conftest import TRACES, run_cli
from tests.kineto_trace import KinetoTrace

GIB = 2**30


def raised(analysis) -> dict[str, str]:
    return {f.id: f.severity for f in analysis.findings if f.severity in ("warning", "critical")}


def h2d_bound(path):
    """The H200 job of the issue: each 23 ms step copies 1 GiB from pinned memory (19 ms at
    56.5 GB/s), runs ten 150 us kernels queued behind the copy, synchronizes, then launches a
    few more kernels."""
    t = KinetoTrace()
    for k in range(3):
        t0 = 1000 + k * 23_000
        t.step(10 + k, t0, 23_000)
        t.to_device(t0 + 50, GIB, t0 + 80, 19_000)
        for i in range(10):
            t.launch(t0 + 120 + 20 * i, "void at::native::vectorized_elementwise_kernel<4>()",
                     t0 + 19_090 + 160 * i, 150)
        t.runtime("cudaDeviceSynchronize", t0 + 400, 20_300)
        for i in range(3):
            t.launch(t0 + 20_750 + 20 * i, "void at::native::reduce_kernel<512, 1>()",
                     t0 + 20_800 + 110 * i, 100, op="aten::sum")
    return t.write(path)


def test_link_capacity_is_derived_from_the_pcie_generation_and_width():
    # 32 GT/s x 16 lanes x 128/130 / 8 bits: the issue's ~63 GB/s per direction.
    assert pcie_gb_per_s(5, 16) == pytest.approx(63.015, abs=0.01)
    assert pcie_gb_per_s(4, 16) == pytest.approx(31.51, abs=0.01)
    assert pcie_gb_per_s(3, 16) == pytest.approx(15.75, abs=0.01)
    assert pcie_gb_per_s(2, 16) == pytest.approx(8.0)  # 5 GT/s, 8b/10b
    assert host_link("NVIDIA H200").name == "PCIe Gen5 x16"
    assert host_link("NVIDIA H100 80GB HBM3").gb_per_s == pytest.approx(63.02, abs=0.01)
    assert host_link("NVIDIA A100-PG509-200").name == "PCIe Gen4 x16"
    assert host_link("Tesla V100-SXM2-32GB").name == "PCIe Gen3 x16"
    assert host_link("AMD Instinct MI300X VF").name == "PCIe Gen5 x16"
    assert host_link("NVIDIA GH200 480GB").name == "NVLink-C2C"
    # A GPU the table does not know gets no figure rather than a guess.
    assert host_link("AMD Radeon Graphics") is None
    assert host_link(None) is None


def test_a_step_bounded_by_host_to_device_copies_is_copy_bound(tmp_path):
    a = analyze_trace(h2d_bound(tmp_path / "h2d_bound.json"))
    busy = a.metrics["busy"]
    h2d = busy["classes"]["h2d"]
    assert h2d["bytes"] == 3 * GIB and h2d["count"] == 3
    assert h2d["gb_per_s"] == pytest.approx(GIB / 19e-3 / 1e9, rel=0.01)  # 56.5 GB/s
    assert busy["link"]["name"] == "PCIe Gen5 x16"
    assert h2d["link_pct"] == pytest.approx(89.7, abs=0.5)
    assert h2d["pinned_pct"] == 100.0
    assert h2d["pct"] > 80 and h2d["exposed_ms"] == pytest.approx(57.0, abs=0.1)
    assert busy["classes"]["compute"]["ms"] == pytest.approx(5.4, abs=0.1)
    assert a.verdict == "copy-bound", a.findings
    top = a.findings[0]
    assert top.severity == "critical"
    assert "3.00 GiB" in top.evidence and "56.5 GB/s" in top.evidence, top.evidence
    assert "PCIe Gen5 x16" in top.evidence and "1.00 GiB per step" in top.evidence
    # More copying than compute: overlapping cannot hide it, moving less is the fix that fits.
    assert top.fix.startswith("Move less over the link: keep what every step reuses on the GPU")
    assert "smaller dtypes" in top.fix and "non_blocking=True" in top.fix


def test_the_busy_breakdown_is_in_the_json_and_the_report(tmp_path):
    path = h2d_bound(tmp_path / "h2d_bound.json")
    proc = run_cli("analyze", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    busy = json.loads(proc.stdout)["metrics"]["busy"]
    assert set(busy["classes"]) >= {"compute", "communication", "h2d", "d2h", "d2d", "memset"}
    for row in busy["classes"].values():
        assert {"ms", "pct"} <= set(row)
    assert {"bytes", "gb_per_s", "exposed_ms", "link_pct"} <= set(busy["classes"]["h2d"])
    text = run_cli("analyze", str(path)).stdout
    assert "Verdict: copy-bound (critical)" in text
    assert "GPU busy time:" in text and "H2D copies 3.00 GiB" in text, text


def end_of_window_read(path, launches_after: bool):
    """A GPU kept busy by 200 queued 1 ms kernels while the host waits 196 ms in a final
    ``y.cpu()`` (a pageable device-to-host read). With ``launches_after`` the host then
    launches the next step's kernels, so the read held back the pipeline."""
    t = KinetoTrace()
    for i in range(200):
        t.launch(100 + 20 * i, "void at::native::vectorized_elementwise_kernel<4>()",
                 200 + 1000 * i, 1000)
    t.to_host(4_100, 196_200, 4 * 2**20, 200_200, 150)
    if launches_after:
        for i in range(200):
            t.launch(200_400 + 20 * i, "void at::native::vectorized_elementwise_kernel<4>()",
                     200_450 + 1000 * i, 1000)
        t.to_host(204_500, 196_200, 4 * 2**20, 400_450, 150)
    return t.write(path)


def test_a_final_read_on_a_busy_gpu_costs_nothing(tmp_path):
    a = analyze_trace(end_of_window_read(tmp_path / "final_read.json", launches_after=False))
    sync = a.metrics["sync"]
    assert sync["host_blocked_pct"] > 90  # the host did wait, all the window long ...
    assert sync["gpu_idle_cost_ms"] < 1  # ... on a GPU that never ran dry,
    assert sync["d2h_read_blocked_ms"] == 0  # and nothing was to be launched after it.
    assert "host-sync" not in raised(a), a.findings
    assert a.verdict == "healthy", a.findings


def test_a_read_that_holds_back_later_launches_still_counts(tmp_path):
    a = analyze_trace(end_of_window_read(tmp_path / "mid_read.json", launches_after=True))
    # The first read blocks the host while it could have queued the next 200 kernels.
    assert a.metrics["sync"]["d2h_read_blocked_pct"] > 25
    assert raised(a).get("host-sync") == "warning", a.findings


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")
def test_real_traces_account_their_copies():
    # resnet50_nw0: 12 pageable batch uploads on a V100 (PCIe Gen3 x16).
    a = analyze_trace(TRACES / "resnet50_nw0.pt.trace.json.gz")
    busy = a.metrics["busy"]
    h2d = busy["classes"]["h2d"]
    assert h2d["count"] == 12 and h2d["bytes"] == 115_607_040 and h2d["pinned_pct"] == 0
    assert 9 < h2d["gb_per_s"] < 11 and busy["link"]["gb_per_s"] == 15.75
    assert busy["classes"]["compute"]["pct"] == pytest.approx(55.5, abs=0.5)
    assert "copy-bound" not in {f.id for f in a.findings}  # 1% of the step: not the bound
    # hta_trace_diff_test: device-to-device copies (no link figure for them).
    d2d = analyze_trace(TRACES / "hta_trace_diff_test.json.gz").metrics["busy"]["classes"]["d2d"]
    assert d2d["count"] == 4645 and d2d["gb_per_s"] > 100 and "link_pct" not in d2d


def test_a_first_batch_copy_is_a_one_off_not_the_steady_state(tmp_path):
    """Five 10 ms compute-bound steps; the first also uploads 2 GiB once (pageable, 160 ms,
    the host staging it): judged apart, so no copy or staging finding for the steady steps."""
    t = KinetoTrace()
    t0 = 1000.0
    for k in range(5):
        start = t0
        t.step(k + 1, start, 0)  # duration set below
        if k == 0:
            t.to_device(t0 + 20, 2 * GIB, t0 + 60, 160_000, pinned=False)
            t0 += 160_100
        for i in range(50):
            t.launch(t0 + 10 + 15 * i, "void gemm_kernel<__half>()", t0 + 30 + 200 * i, 195,
                     op="aten::mm")
        t0 += 10_100
        t.events[[e.get("name") for e in t.events].index(f"ProfilerStep#{k + 1}")]["dur"] = (
            t0 - start)
    a = analyze_trace(t.write(tmp_path / "first_batch.json"))
    (one_off,) = a.metrics["one_offs"]
    assert one_off["position"] == "first" and one_off["h2d_bytes"] == 2 * GIB
    assert one_off["excess_ms"] > 150
    assert a.metrics["busy"]["classes"]["h2d"]["bytes"] == 0  # not in the judged steps
    assert a.verdict == "healthy", a.findings
    assert "One-off first step, not judged: ProfilerStep#1" in run_cli(
        "analyze", str(tmp_path / "first_batch.json")).stdout
