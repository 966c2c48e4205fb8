"""Gap attribution on traces recorded here and now from real CPU and gloo runs
(tests/scripts/attribution_cases.py), one per class the engine must tell apart:

- a host that waits on a busy device is not a host sync, however long it waits;
- idle that follows a sync which returned at once belongs to what the host did next (a Python
  function, named);
- a trace without steps is judged only where both sides were recorded (the profiler's edges
  are not the program's);
- a trace of compilation is start-up (cold-start), not a steady-state problem;
- a one-off first step (a 0.2 s wait once) or a last step that holds only the time before the
  profiler stops is judged apart: the steady steps decide the verdict.

Without a GPU, the device is the CPU's own compute (the operators) and the collectives a gloo
thread runs; the same attribution code serves GPU traces (tests/test_trace_shared.py).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gputop.diagnostics.trace.analysis import analyze_trace
from tests.conftest import REPO, SLOW, cli_env, run_cli

pytest.importorskip("torch")

CASES = REPO / "tests" / "scripts" / "attribution_cases.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(spawn, tmp: Path, case: str) -> Path:
    """Run one case (two gloo ranks where it needs them) and return rank 0's trace."""
    out = tmp / f"{case}.json"
    ranks = 2 if case in ("busy_wait", "python_after_sync") else 1
    port = str(free_port())
    procs = [
        spawn([sys.executable, str(CASES), case, str(r), port, str(out)],
              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
              env=cli_env(OMP_NUM_THREADS="1"))
        for r in range(ranks)
    ]
    for p in procs:
        _, err = p.communicate(timeout=2 * SLOW)
        assert p.returncode == 0, err[-3000:]
    assert out.is_file()
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("attribution")
    started: list[subprocess.Popen] = []

    def spawn(args, **kw):
        started.append(subprocess.Popen(args, **kw))
        return started[-1]

    try:
        return {case: record(spawn, tmp, case)
                for case in ("busy_wait", "python_after_sync", "no_steps", "cold_start",
                             "one_off_first", "profiler_tail")}
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()


def raised(analysis) -> set[str]:
    return {f.id for f in analysis.findings if f.severity in ("warning", "critical")}


@pytest.mark.timeout(6 * SLOW)
def test_waiting_on_a_busy_device_is_not_a_host_sync(traces):
    a = analyze_trace(traces["busy_wait"])
    sync = a.metrics["sync"]
    # The wait is seen (the host sits in Work.wait() most of each step) ...
    assert sync["host_blocked_pct"] >= 30, sync
    # ... but the collective runs all that time, so it costs the device nothing.
    breakdown = a.metrics["step_breakdown"]
    assert "host-sync" not in raised(a), (a.findings, sync, breakdown)
    assert sync["gpu_idle_cost_ms"] < 0.05 * breakdown["ms"]["total"], (sync, breakdown)
    # What the step is bound by is the collective itself.
    assert a.verdict == "communication", (a.verdict, a.findings, breakdown)


@pytest.mark.timeout(6 * SLOW)
def test_idle_after_a_sync_belongs_to_the_python_work_that_follows(traces):
    a = analyze_trace(traces["python_after_sync"])
    assert "host-sync" not in raised(a)
    assert a.verdict == "gpu-idle", a.findings
    top = a.findings[0]
    assert top.id == "gpu-idle" and "preprocess_batch" in top.title + top.evidence
    assert "attribution_cases.py:" in top.evidence  # the function and its line
    host = a.metrics["idle_attribution"]["host"]
    assert host["pct"] >= 25 and host["top"][0][0].startswith("preprocess_batch")


@pytest.mark.timeout(6 * SLOW)
def test_a_trace_without_steps_is_judged_where_both_sides_recorded(traces):
    a = analyze_trace(traces["no_steps"])
    window = a.metrics["window"]
    assert window["steps_from"] == "recorded span"
    assert "both the host" in window["judged"]
    # The profiler's 0.3 s edges (sleeps before and after the work) are left out ...
    assert window["left_out_before_ms"] >= 250 and window["dur_ms"] < 2000
    # ... so they raise nothing: a busy compute loop is healthy, and the report says which
    # window it judged.
    assert a.verdict == "healthy", a.findings
    assert any("window judged" in note for note in a.assessed)


@pytest.mark.timeout(6 * SLOW)
def test_a_compilation_trace_is_cold_start(traces):
    a = analyze_trace(traces["cold_start"])
    assert a.verdict == "cold-start", a.findings
    finding = a.findings[0]
    assert finding.severity == "critical" and "torch.compile" in finding.evidence
    assert "schedule(" in finding.fix  # profile after warm-up


@pytest.mark.timeout(6 * SLOW)
def test_the_cli_reports_the_window_and_the_idle_causes(traces):
    proc = run_cli("analyze", str(traces["python_after_sync"]))
    assert proc.returncode == 0, proc.stderr
    assert "Window: 4 profiler step(s)" in proc.stdout
    assert "H idle: host work" in proc.stdout and "preprocess_batch" in proc.stdout


@pytest.mark.timeout(6 * SLOW)
@pytest.mark.parametrize("case,position,step", [("one_off_first", "first", "ProfilerStep#1"),
                                                ("profiler_tail", "last", "ProfilerStep#6")])
def test_one_off_edge_steps_are_judged_apart(traces, case, position, step):
    a = analyze_trace(traces[case])
    # The steady compute steps are healthy; the 0.2 s the edge step spends idle would have made
    # the whole window gpu-idle (critical).
    assert a.verdict == "healthy", (a.findings, a.metrics["one_offs"])
    (one_off,) = a.metrics["one_offs"]
    assert one_off["step"] == step and one_off["position"] == position
    assert one_off["excess_ms"] >= 150 and one_off["top"][0][0] == "host"
    assert step not in a.metrics["steps"]["names"] and a.metrics["steps"]["count"] >= 4
    assert "left out as a one-off" in a.metrics["window"]["judged"]
    proc = run_cli("analyze", str(traces[case]))
    assert f"One-off {position} step, not judged: {step}" in proc.stdout, proc.stdout
