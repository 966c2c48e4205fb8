"""Idle with work already queued on the device: named by what the work waits for, and never
charged to a sync the host sat in meanwhile.

CUDA graphs, streams and CUPTI's synchronisation records cannot come from a CPU-only torch, so
the traces are written in Kineto's own schema (tests/kineto_trace.py).
"""

from __future__ import annotations

import pytest

from gputop.diagnostics.trace.analysis import analyze_trace
from tests.conftest import TRACES, run_cli
from tests.kineto_trace import KinetoTrace


def raised(analysis) -> dict[str, str]:
    return {f.id: f.severity for f in analysis.findings if f.severity in ("warning", "critical")}


def graph_steps(path):
    """Each 4 ms step replays a CUDA graph of ten 100 us kernels that run 300 us apart (its
    nodes wait on each other), then the host waits in cudaStreamSynchronize."""
    t = KinetoTrace()
    for k in range(3):
        t0 = 1000 + 4000 * k
        t.step(k + 1, t0, 4000)
        t.op("aten::copy_", t0 + 10, 30)
        corr = t.runtime("cudaGraphLaunch", t0 + 50, 40)
        for i in range(10):
            t.kernel(corr, "void at::native::vectorized_elementwise_kernel<4>()",
                     t0 + 100 + 300 * i, 100)
        t.runtime("cudaStreamSynchronize", t0 + 100, 2803)  # returns as the last node ends
    return t.write(path)


def stream_wait_steps(path):
    """Each 5 ms step runs a 1 ms kernel on stream 7, records an event and makes stream 20
    wait on it (torch: stream.wait_stream), launches the next kernel on stream 20 (which
    starts 2.5 ms after the first ended), then waits in cudaDeviceSynchronize."""
    t = KinetoTrace()
    for k in range(3):
        t0 = 1000 + 5000 * k
        t.step(k + 1, t0, 5000)
        t.launch(t0 + 10, "void gemm_kernel<float>()", t0 + 40, 1000, op="aten::mm")
        record = t.runtime("cudaEventRecord", t0 + 30, 3)
        wait = t.runtime("cudaStreamWaitEvent", t0 + 40, 3)
        t.stream_wait(wait, t0 + 41, stream=20, on_stream=7, event_corr=record)
        t.launch(t0 + 50, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
                 t0 + 3540, 1000, op="c10d::allreduce_", stream=20)
        t.runtime("cudaDeviceSynchronize", t0 + 70, 4473)
    return t.write(path)


def test_queued_graph_nodes_are_named_and_the_sync_costs_nothing(tmp_path):
    a = analyze_trace(graph_steps(tmp_path / "graph.json"))
    queued = a.metrics["idle_attribution"]["queued"]
    assert queued["pct"] == 45.0, a.metrics["step_breakdown"]  # 9 gaps of 200 us a step
    assert queued["waits_for"][0]["reason"] == "graph"
    # The host sat in cudaStreamSynchronize through every gap: it waited on the graph, it did
    # not cause the idle.
    # (the few microseconds it takes to return once the last node is done are its own)
    assert a.metrics["sync"]["gpu_idle_cost_ms"] < 0.01 * a.metrics["window"]["dur_ms"]
    assert "host-sync" not in {f.id for f in a.findings}
    assert a.verdict == "gpu-idle"
    top = a.findings[0]
    assert "work already queued" in top.title and "CUDA graph" in top.title, top.title
    assert "--cuda-graph-trace=node" in top.next_step


def test_a_cross_stream_dependency_is_named_with_its_streams(tmp_path):
    path = stream_wait_steps(tmp_path / "stream_wait.json")
    a = analyze_trace(path)
    waits = a.metrics["idle_attribution"]["queued"]["waits_for"]
    assert waits[0]["reason"] == "stream-wait"
    assert "stream 20 waits on stream 7" in waits[0]["label"], waits
    assert a.metrics["sync"]["gpu_idle_cost_ms"] < 0.01 * a.metrics["window"]["dur_ms"]
    assert "host-sync" not in {f.id for f in a.findings}
    top = next(f for f in a.findings if "queued" in f.title)
    assert top.severity == "critical" and "cross-stream dependency" in top.title
    assert "wait_stream" in top.fix
    report = run_cli("analyze", str(path)).stdout
    assert "queued" in report and "waiting for a cross-stream dependency" in report, report


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")
def test_queued_idle_in_a_real_trace_is_named_and_raised():
    # hta_timeline_rank0: a sampled rank of a 128-rank job; a quarter of its window is work
    # queued behind what the sampling left out. Named and raised on its own, never a sync.
    a = analyze_trace(TRACES / "hta_timeline_rank0.json.gz")
    queued = a.metrics["idle_attribution"]["queued"]
    assert queued["pct"] > 20 and queued["waits_for"], queued
    assert {row["reason"] for row in queued["waits_for"]} <= {
        "graph", "stream-wait", "other-device", "collective", "unrecorded", "unnamed"}
    assert any("work already queued" in f.title for f in a.findings if f.id == "gpu-idle")
    assert "host-sync" not in {f.id for f in a.findings}
