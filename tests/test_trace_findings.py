"""The Finding type, the catalogue of ids and the verdict, shared by trace and live rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gputop.diagnostics.findings import (
    CATALOGUE,
    SEVERITY_RANK,
    Finding,
    healthy_reason,
    order_findings,
    verdict,
)
from tests.conftest import REPO, SHARED


def make(id_: str, severity: str, cost_s: float, **kw) -> Finding:
    return Finding(
        id=id_,
        severity=severity,
        title=f"{id_} title",
        evidence="numbers",
        fix="a fix",
        next_step="nsys profile ...",
        cost_s=cost_s,
        **kw,
    )


def test_catalogue_matches_the_design_table():
    design = SHARED / "DESIGN.md"
    if not design.exists():
        pytest.skip("../shared/DESIGN.md not present")
    ids = re.findall(r"^\| `([a-z-]+)` \|", design.read_text(), flags=re.M)
    assert len(ids) >= 17
    # DESIGN.md's ids first, in its order; then the ids docs/decisions/ records as
    # departures from it, each with its reason, and each in the README's tables.
    assert list(CATALOGUE)[: len(ids)] == ids
    extra = list(CATALOGUE)[len(ids):]
    docs = Path(__file__).resolve().parents[1] / "docs"
    # The departures are recorded in the design journal (docs/decisions/), with their reasons.
    decisions = "".join(p.read_text() for p in sorted((docs / "decisions").glob("*.md")))
    assert all(f"`{i}`" in decisions for i in extra), extra
    # The README's table, or a feature page's in docs/ (the hang ids: docs/hangs.md).
    tables = (REPO / "README.md").read_text() + "".join(
        p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    assert all(f"| `{i}` |" in tables for i in extra), extra
    assert all(CATALOGUE[i] for i in CATALOGUE)


def test_unknown_ids_and_severities_are_rejected():
    with pytest.raises(ValueError):
        make("dataloader-stal", "warning", 1.0)
    with pytest.raises(ValueError):
        make("host-sync", "severe", 1.0)


def test_to_json_has_the_documented_keys_and_optional_gpu_pid():
    plain = make("host-sync", "warning", 0.25).to_json()
    assert {"id", "severity", "title", "evidence", "fix", "next_step"} <= set(plain)
    assert "gpu" not in plain and "pid" not in plain
    placed = make("contention", "critical", 0.0, gpu=1, pid=4242).to_json()
    assert placed["gpu"] == 1 and placed["pid"] == 4242


def test_findings_are_ordered_by_cost_and_the_verdict_ignores_info():
    findings = [
        make("no-tensor-cores", "info", 9.0),
        make("host-sync", "warning", 0.5),
        make("dataloader-stall", "critical", 3.0),
    ]
    ordered = order_findings(findings)
    assert [f.id for f in ordered] == ["no-tensor-cores", "dataloader-stall", "host-sync"]
    # The costliest finding of warning or worse names the verdict, info never does.
    assert verdict(findings) == "dataloader-stall"
    assert verdict([make("no-tensor-cores", "info", 9.0)]) == "healthy"
    assert SEVERITY_RANK["critical"] > SEVERITY_RANK["warning"] > SEVERITY_RANK["info"]


def test_healthy_reason_names_minor_findings_and_is_none_when_not_healthy():
    assert healthy_reason([], "GPU busy 97%") == "GPU busy 97%"
    minor = healthy_reason([make("pageable-memcpy", "info", 0.1)], "GPU busy 90%")
    assert minor == "GPU busy 90%; minor only: pageable-memcpy"
    assert healthy_reason([make("host-sync", "warning", 0.1)], "x") is None
