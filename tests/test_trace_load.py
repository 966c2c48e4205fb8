"""Loading: schema variants, tolerance to odd events, and no crash on any subset of a trace."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputop.diagnostics.trace.analysis import TraceError, analyze_trace
from gputop.diagnostics.trace.loading.load import load_trace
from tests.conftest import TRACES

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")

OLD = TRACES / "kineto_2021_schema.json"
SYNC = TRACES / "hta_event_sync.json.gz"
TRITON = TRACES / "hta_triton.json.gz"
ROCM = TRACES / "hta_rocm_mi250.json.gz"


def test_each_schema_is_filed_by_role():
    old = load_trace(OLD)  # Operator/Runtime/Kernel/Memcpy categories, computeProperties
    assert old.kernels and old.runtime and old.memcpys and old.cpu_ops and old.steps
    assert old.devices[0].compute_major == 7
    triton = load_trace(TRITON)  # a Triton kernel launched through the driver API
    launches = {rt.args.correlation for rt in triton.runtime if rt.name == "cuLaunchKernel"}
    assert triton.kernels[0].args.correlation in launches
    rocm = load_trace(ROCM)  # hip* runtime, string streams such as "0x0"
    assert any(rt.name.startswith("hip") for rt in rocm.runtime)
    assert any(isinstance(rt.args.stream, str) for rt in rocm.runtime if rt.args)
    ns = load_trace(TRACES / "hta_ns_resolution.pt.trace.json.gz")  # float ns timestamps
    assert any(k.ts % 1 for k in ns.kernels[:50])
    assert ns.rank == 0 and ns.world_size == 1


def test_gzip_is_detected_by_content_not_name(tmp_path):
    disguised = tmp_path / "trace.json"
    disguised.write_bytes(SYNC.read_bytes())
    assert analyze_trace(disguised).verdict == analyze_trace(SYNC).verdict


def test_events_of_unexpected_types_are_skipped_not_fatal(tmp_path):
    doc = json.loads(OLD.read_text())
    n = len(doc["traceEvents"])
    doc["traceEvents"].insert(5, {"ph": "X", "name": "odd", "ts": "not a time", "dur": 1})
    doc["traceEvents"].insert(9, {"ph": "X", "cat": "Kernel", "name": "k", "args": "oops"})
    doc["deviceProperties"] = "not a list"
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    data = load_trace(path)
    assert data.n_events == n  # the two odd events dropped, every real one kept
    assert data.devices == []
    assert analyze_trace(path).metrics["steps"]["count"] == 1


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), keep=st.floats(0.0, 1.0))
def test_any_subset_of_a_real_trace_analyses_or_fails_cleanly(tmp_path, seed, keep):
    """Profiles cut short, filtered or reordered must never crash the analysis."""
    doc = json.loads(gzip.decompress(SYNC.read_bytes()))
    rng = random.Random(seed)
    events = [ev for ev in doc["traceEvents"] if rng.random() < keep]
    rng.shuffle(events)
    doc["traceEvents"] = events
    path = tmp_path / f"subset-{seed}.json"
    path.write_text(json.dumps(doc))
    try:
        result = analyze_trace(path)
    except TraceError as exc:
        assert "no profiler events" in str(exc)
        return
    out = result.to_json()
    json.dumps(out, allow_nan=False)  # serialisable, no NaN/inf
    # healthy, a finding raised, or (GPU activity cut out) not assessed with the reason said
    assert out["verdict"] == "healthy" or out["verdict"] in [f["id"] for f in out["findings"]] or (
        out["verdict"] == "not-assessed" and out["metrics"]["trace"]["gpu_unrecorded"])
