"""`gputop analyze --compare BASE NEW`: what changed between two traces of one job.

Real traces: the same CPU job profiled with its DataLoader slowed and fixed
(tests/scripts/compare_job.py, recorded in tests/data/compare/), and the shared ResNet-50
traces of one model with num_workers=0 and 4 (../shared/traces, skipped when absent).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, TRACES, run_cli

PAIR = REPO / "tests" / "data" / "compare"


def compare_json(base, new) -> dict:
    proc = run_cli("analyze", "--compare", str(base), str(new), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def part(c: dict, name: str) -> dict:
    return next(r for r in c["parts"] if r["part"] == name)


def test_the_dataloader_wait_is_what_changed():
    c = compare_json(PAIR / "input_bound", PAIR / "fixed")
    assert c["delta_ms"] < 0 and "faster a step" in c["verdict"]
    assert "DataLoader wait" in c["verdict"].split(":", 1)[1].split(",")[0]
    assert "compute unchanged" in c["verdict"]
    loader = part(c, "dataloader")
    assert loader["delta_ms"] == min(r["delta_ms"] for r in c["parts"])
    assert abs(loader["delta_ms"]) > 0.8 * abs(c["delta_ms"])
    assert c["base"]["steps"] == c["new"]["steps"] == [3]


def test_the_other_way_is_slower_and_the_text_says_so():
    proc = run_cli("analyze", "--compare", str(PAIR / "fixed"), str(PAIR / "input_bound"))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("NEW is ") and "slower a step" in first and "DataLoader wait" in first
    assert "idle, by cause" in proc.stdout and "busy, by class" in proc.stdout


@pytest.mark.skipif(not (TRACES / "resnet50_nw0.pt.trace.json.gz").is_file(),
                    reason="../shared/traces not present")
def test_shared_traces_of_one_model_with_and_without_the_fix():
    c = compare_json(TRACES / "resnet50_nw0.pt.trace.json.gz",
                     TRACES / "resnet50_nw4.pt.trace.json.gz")
    assert "faster a step" in c["verdict"]
    assert c["verdict"].split(": ", 1)[1].startswith("-") and "of DataLoader wait" in \
        c["verdict"].split(",")[0]
    assert part(c, "dataloader")["delta_ms"] < -30
    assert any(f["id"] == "dataloader-stall" for f in c["findings"]["cleared"])


def test_bad_sides_are_one_line_errors(tmp_path):
    proc = run_cli("analyze", "--compare", str(tmp_path / "nope"), str(PAIR / "fixed"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "no such file" in proc.stderr
    proc = run_cli("analyze", "--compare", str(tmp_path), str(PAIR / "fixed"))
    assert proc.returncode == 2 and "no trace in this folder" in proc.stderr
    proc = run_cli("analyze", str(PAIR / "fixed"), "--compare", str(PAIR / "fixed"),
                   str(PAIR / "fixed"))
    assert proc.returncode != 0 and "takes no other trace" in proc.stderr


def test_compare_in_process_orders_op_changes():
    from gputop.diagnostics.trace.analysis import analyze_trace
    from gputop.diagnostics.trace.reporting.compare import compare, format_compare

    base = [analyze_trace(next((PAIR / "input_bound").iterdir()))]
    new = [analyze_trace(next((PAIR / "fixed").iterdir()))]
    c = compare(base, new)
    deltas = [abs(r["delta_ms"]) for r in c["ops"]["changed"]]
    assert deltas == sorted(deltas, reverse=True)
    assert c["verdict"] in format_compare(c)
