"""The human report: exact-width breakdown bar, wrapping, names shortened for people and ncu."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputop.diagnostics.trace.analysis import analyze_trace
from gputop.diagnostics.trace.measuring.kernels import kernel_base_name, short_kernel_name
from gputop.diagnostics.trace.measuring.metrics import ROLE_ORDER
from gputop.diagnostics.trace.reporting.report import BAR_ROLES, breakdown_bar, format_report
from tests.conftest import TRACES

needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")


@given(
    st.dictionaries(st.sampled_from(ROLE_ORDER), st.floats(0, 100), min_size=1),
    st.integers(10, 200),
)
def test_bar_is_exactly_as_wide_as_asked_and_proportional(pct, width):
    bar, _ = breakdown_bar(pct, width)
    assert len(bar) == width
    shares = {letter: sum(pct.get(k, 0.0) for k in keys) for keys, letter, _ in BAR_ROLES}
    whole = sum(shares.values())
    if whole > 0:
        for letter, share in shares.items():
            assert abs(bar.count(letter) - width * share / whole) < 1


def test_kernel_names_for_people_and_for_ncu():
    name = (
        "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, "
        "float const*, int, float const*, int, float*, kernel_grad_params, unsigned long long)"
    )
    assert kernel_base_name(name) == "dgrad_engine"
    assert short_kernel_name(name) == "cudnn::detail::dgrad_engine<…>"
    assert kernel_base_name("volta_sgemm_128x64_nn") == "volta_sgemm_128x64_nn"
    assert kernel_base_name("triton_poi_fused_add_cos_sin_0") == "triton_poi_fused_add_cos_sin_0"
    assert len(short_kernel_name("x" * 300, limit=40)) == 40


@needs_traces
@pytest.mark.parametrize("width", [60, 100, 140])
@pytest.mark.parametrize(
    "name",
    ["resnet50_nw0.pt.trace.json.gz", "hta_cpu_only.pt.trace.json.gz", "hta_alexnet_setup.json.gz",
     "hta_event_sync.json.gz"],
)
def test_report_respects_its_width_and_says_what_it_could_not_assess(name, width):
    analysis = analyze_trace(TRACES / name)
    text = format_report(analysis, width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    # A figure stays with its words: no line is a percentage alone ("  1.6%").
    assert not [line for line in lines if re.fullmatch(r"\s*[\d.]+ ?%[.,;)]?\s*", line)]
    assert lines[0] == f"gputop analyze: {name}"
    assert any(line.startswith("Verdict: ") for line in lines)
    assert sum(1 for line in lines if line.startswith("  [") and line.endswith("]")) == 1
    for f in analysis.findings:
        assert f"{f.id}:" in text
    if analysis.not_assessed:
        assert "Not assessed:" in text


@needs_traces
def test_healthy_report_gives_the_reason():
    text = format_report(analyze_trace(TRACES / "hta_ns_resolution.pt.trace.json.gz"))
    assert "Verdict: healthy - GPU busy 98% of the step time" in text
