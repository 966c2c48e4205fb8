"""Traces of a GPU program whose GPU activity was not recorded: the host alone is assessed, and
no device verdict is given (neither a cause of GPU idle nor "healthy").

The traces are real GPU traces of ../shared/traces with their device side removed the two ways
it happens: stripped (kernels, copies, memsets and GPU-side records dropped, the CUDA runtime
calls kept), or recorded with CUPTI's range profiler, which writes each kernel as a
``cuda_profiler_range`` range of counters spread evenly over the profiled span, with no timing
(Kineto's CuptiRangeProfiler.cpp) and no runtime records of its own.
"""

from __future__ import annotations

import gzip
import json

import pytest

from gputop.diagnostics.trace.analysis import analyze_trace
from tests.conftest import TRACES, run_cli

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "gpu_user_annotation",
               "cuda_sync", "ac2g"}
DEVICE_VERDICTS = {"gpu-idle", "launch-bound", "host-sync", "communication", "copy-bound",
                   "pageable-memcpy", "long-gpu-gaps", "no-tensor-cores", "allocator-churn"}


def _events(name: str) -> dict:
    with gzip.open(TRACES / name, "rt") as fh:
        return json.load(fh)


def stripped(name: str, out):
    doc = _events(name)
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if (e.get("cat") or "").lower() not in DEVICE_CATS]
    out.write_text(json.dumps(doc))
    return out


def range_profiled(name: str, out):
    doc = _events(name)
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    timed = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    each = (max(e["ts"] + e.get("dur", 0) for e in timed) - start) / len(kernels)
    keep = [e for e in events if (e.get("cat") or "").lower() not in DEVICE_CATS | {
        "cuda_runtime", "cuda_driver"}]
    ranges = [{"ph": "X", "cat": "cuda_profiler_range", "name": k["name"], "pid": 0, "tid": 0,
               "ts": start + i * each, "dur": each,
               "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 4096}}
              for i, k in enumerate(kernels)]
    doc["traceEvents"] = keep + ranges
    out.write_text(json.dumps(doc))
    return out


def test_stripped_gpu_events_leave_only_a_host_assessment(tmp_path):
    # resnet50_nw0: num_workers=0, the loop waits in the DataLoader every step.
    a = analyze_trace(stripped("resnet50_nw0.pt.trace.json.gz", tmp_path / "stripped.json"))
    assert a.metrics["trace"]["gpu_activity"] is False
    assert "CUDA/HIP runtime calls" in a.metrics["trace"]["gpu_unrecorded"]
    ids = {f.id for f in a.findings}
    assert not ids & DEVICE_VERDICTS, a.findings
    # The host still shows its DataLoader wait (TensorBoard's DataLoader share is host time).
    assert a.verdict == "dataloader-stall"
    assert "GPU activity not recorded" in a.findings[0].title
    assert a.metrics["host_breakdown"]["pct"]["dataloader"] > 25
    assert any("its activity was not recorded" in n for n in a.not_assessed), a.not_assessed
    text = run_cli("analyze", str(tmp_path / "stripped.json")).stdout
    assert "GPU activity not recorded" in text and "training thread's step time" in text


def test_kernels_recorded_only_as_profiler_ranges_give_no_device_verdict(tmp_path):
    # tracelens_h100_bert_small: launch-bound inference; its device side as range records.
    path = range_profiled("tracelens_h100_bert_small.json.gz", tmp_path / "ranges.json")
    a = analyze_trace(path)
    assert "range-profiler ranges" in a.metrics["trace"]["gpu_unrecorded"]
    assert a.findings == [] and a.verdict == "not-assessed" and a.healthy_reason is None
    assert a.metrics["gpu"]["busy_pct_of_steps"] is None
    proc = run_cli("analyze", "--json", str(path))
    assert json.loads(proc.stdout)["verdict"] == "not-assessed"
    assert "Verdict: not assessed - GPU activity was not recorded" in run_cli(
        "analyze", str(path)).stdout


def test_a_cpu_job_is_still_judged_as_one():
    # No runtime calls, no device properties, gloo: a CPU job, its operators the compute.
    a = analyze_trace(TRACES / "hta_cpu_only.pt.trace.json.gz")
    assert a.metrics["trace"]["gpu_unrecorded"] is None
    assert a.verdict == "communication"
