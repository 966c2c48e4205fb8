"""Cross-rank diagnosis on the real 8-rank DLRM job in ../shared/traces (ranks 0-7 of one job,
the same step): per-rank exposed communication checked against HTA's comm/comp overlap
definition, computed here independently from the raw kernel events; and the sign test that
keeps a rank late now and then from being blamed."""

from __future__ import annotations

import gzip
import json

import pytest

from gputop.diagnostics.trace.analysis import analyze_trace, compare_job
from gputop.diagnostics.trace.measuring.intervals import intersect, merge, total
from gputop.diagnostics.trace.ranks import CHANCE_MAX, chance_of_last
from tests.conftest import TRACES, run_cli

RANKS = sorted(TRACES.glob("dlrm8_rank*.json.gz")) if TRACES.is_dir() else []
needs_job = pytest.mark.skipif(len(RANKS) != 8, reason="../shared/traces/dlrm8_rank*.json.gz absent")


def hta_overlap_pct(path) -> float:
    """HTA's comp_comm_overlap_pctg: the share of communication kernel time that overlaps
    computation kernels (GPU kernels other than NCCL and memcpy/memset)."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    comm, comp = [], []
    for e in events:
        if e.get("cat") != "kernel" or e.get("ph") != "X":
            continue
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        (comm if "nccl" in e["name"].lower() else comp).append(span)
    comm_time = total(merge(comm))
    return 100 * total(intersect(merge(comm), merge(comp))) / comm_time


@needs_job
def test_per_rank_exposed_communication_agrees_with_htas_overlap_definition():
    result = run_cli("analyze", "--json", *map(str, RANKS))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["metrics"]["trace"]["rank"] for r in rows] == list(range(8))
    for path, row in zip(RANKS, rows):
        comm = row["metrics"]["communication"]
        assert abs(comm["overlap_pct"] - hta_overlap_pct(path)) <= 2.0, path.name
        cross = {c["rank"]: c for c in row["cross_rank"]["ranks"]}[row["metrics"]["trace"]["rank"]]
        # Exposed communication is split, whole, into waiting for a late rank and bandwidth.
        assert cross["exposed_comm_ms"] > 0
        assert cross["exposed_waiting_for_late_rank_ms"] + cross["exposed_bandwidth_ms"] == (
            pytest.approx(cross["exposed_comm_ms"], abs=0.01))
        assert 0 <= cross["straggler_score"] <= 1


@needs_job
def test_the_text_report_compares_the_ranks_once_with_a_row_per_rank():
    result = run_cli("analyze", *map(str, RANKS))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Ranks of one job (8 traces") == 1
    table = result.stdout.split("Ranks of one job", 1)[1]
    assert all(f"rank {r} " in table for r in range(8))


@needs_job
def test_a_job_missing_ranks_or_given_twice_is_not_compared_with_itself():
    one = [analyze_trace(str(p)) for p in RANKS[:3]]
    assert len(compare_job(one)) == 1 and len(one[0].cross_rank.rows) == 3
    twice = [analyze_trace(str(RANKS[0])), analyze_trace(str(RANKS[0]))]
    assert compare_job(twice) == []  # the same rank twice is no job


def test_a_rank_last_by_chance_is_not_a_straggler():
    # 4 ranks, 3 steps: last in all 3 is rare by chance (6%), in 2 of 3 it is common (63%).
    assert chance_of_last(4, 3, 3) == pytest.approx(4 / 64)
    assert chance_of_last(4, 3, 3) <= CHANCE_MAX < chance_of_last(4, 3, 2)
    # More steps make a majority telling; one step alone never is.
    assert chance_of_last(8, 10, 6) <= CHANCE_MAX
    assert chance_of_last(4, 1, 1) == 1.0
    assert chance_of_last(1, 5, 5) == 1.0
