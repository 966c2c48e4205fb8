"""The attribution on real 16-rank Megatron-shaped gloo jobs (tensor, context, expert, data
and expert-data parallel groups, 33 process groups; all_to_all in the expert groups,
_all_gather_base and _reduce_scatter_base in the tensor groups), faults injected on known ranks.
The dumps were recorded once by tests/scripts/record_moe_fixtures.py (torchrun, CPU, torch
2.13) and are kept with their file times in tests/data/fr/moe16: exactly the injected ranks
must be named, the others listed as waiting, and the wait measured by the dumps' own clock."""

from __future__ import annotations

import json
import tarfile

import pytest

from gputop.diagnostics.hang import attribute
from gputop.diagnostics.hang.folder import dump_files, load_dumps
from tests.conftest import DATA, run_cli

MOE = DATA / "fr" / "moe16"
INJECTED = {"sleep": [12], "sigstop": [5], "gil": [9], "two": [3, 14], "killed": [7]}
FORMS = ("pickle", "json")


@pytest.fixture(scope="module")
def moe16(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe16")
    for scenario in INJECTED:
        with tarfile.open(MOE / f"{scenario}.tar.xz") as tar:
            tar.extractall(root, filter="data")  # keeps the files' times
    return root


def _report(folder):
    loaded = load_dumps(dump_files(str(folder)))
    assert not loaded.errors and len(loaded.dumps) == 16, loaded.errors
    return attribute(loaded.dumps)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("scenario", list(INJECTED))
def test_exactly_the_injected_ranks_are_named(moe16, scenario, form):
    report = _report(moe16 / scenario / form)
    assert report.verdict == "hang", report.findings
    cause = report.findings[0]
    assert list(cause.ranks) == INJECTED[scenario]
    assert [c["rank"] for c in cause.culprits] == INJECTED[scenario]
    # Each culprit with the collective it failed to join; the healthy ranks wait, not blamed.
    assert cause.collective and cause.process_group and cause.seq is not None
    assert not set(cause.waiting_ranks) & set(INJECTED[scenario])
    assert cause.waiting_ranks
    # Measured to the dumps' own clock, not to now (now, the kept dumps are months old): under
    # a day, the acceptance's bound for dumps written minutes apart.
    assert cause.waited_s is not None and 0 <= cause.waited_s < 86400
    # Every other group's wait is one of its symptoms, not a finding of its own.
    assert len(report.findings) == 1 and len(cause.symptoms) >= 2


def test_a_rank_asleep_before_the_expert_all_to_all_is_named_there(moe16):
    cause = _report(moe16 / "sleep" / "pickle").findings[0]
    assert cause.collective == "gloo:all_to_all"
    assert cause.process_group["desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
    assert cause.culprits[0]["how"] == "never-entered"
    assert "fr_moe_job.py:" in dict(cause.rank_lines)[12]


def test_two_faulty_ranks_each_get_their_own_collective(moe16):
    cause = _report(moe16 / "two" / "pickle").findings[0]
    by_rank = {c["rank"]: c for c in cause.culprits}
    assert by_rank[3]["process_group"]["desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
    assert by_rank[14]["process_group"]["desc"] == "CONTEXT_PARALLEL_GROUP"


@pytest.mark.parametrize("scenario", ["sigstop", "gil", "killed"])
def test_a_stopped_spinning_or_killed_rank_is_told_by_its_dump_that_stopped(moe16, scenario):
    # Its dump stopped being refreshed at the fault; the others' went on for ~15 s.
    cause = _report(moe16 / scenario / "pickle").findings[0]
    assert cause.culprits[0]["how"] == "stale-dump", cause.culprits


def test_the_json_of_the_cli_has_the_cause_and_waited_s(moe16):
    out = run_cli("analyze", "--json", str(moe16 / "two" / "pickle"))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    hang = data["findings"][0]
    assert data["verdict"] == "hang" and hang["id"] == "hang"
    assert hang["ranks"] == [3, 14] and 0 <= hang["waited_s"] < 86400
    assert data["world_size"] == 16 and data["missing_count"] == 0
    out = run_cli("analyze", str(moe16 / "two" / "pickle"))
    text = " ".join(out.stdout.split())
    assert "rank 3 never reached all_to_all" in text and "rank 14 never reached all_reduce" in text
