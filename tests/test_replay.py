"""`gputop replay`: the live rules over a recording, on its clock, as `watch` prints them.

A demo recording replays into exactly the findings that were raised live (same rules, windows,
hysteresis and clock); the real H200 recordings in ../shared/realgpu (made before gputop kept
whole samples) are rebuilt from their tables and raise their jobs' known causes, none during a
job's start-up; damaged input is skipped and named, never a traceback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import SHARED, SLOW, TOUR_RECORD_S, run_cli

REALGPU = SHARED / "realgpu"
needs_realgpu = pytest.mark.skipif(not REALGPU.is_dir(),
                                   reason="../shared/realgpu (real H200 recordings) not present")
WARNING_OR_WORSE = {"warning", "critical"}


def replay_json(path, *extra: str) -> tuple[list[dict], str]:
    done = run_cli("replay", str(path), "--json", *extra)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr


@pytest.fixture(scope="module")
def tour(tour_recording):
    """30 s of the tour recorded (once for the efficiency tests too)."""
    code, _, err = tour_recording.result(SLOW + TOUR_RECORD_S)
    assert code == 0, err
    return tour_recording.path


def test_a_replay_raises_what_was_raised_live(tour):
    live = pd.read_parquet(tour / "_findings")
    assert not live.empty, "the tour raised nothing live"
    expected = [(row.time, row.state, row.id, None if pd.isna(row.gpu) else int(row.gpu),
                 None if pd.isna(row.pid) else int(row.pid), row.severity, row.evidence)
                for row in live.itertuples()]
    replayed, stderr = replay_json(tour)
    got = [(e["time"], e["state"], e["id"], e["gpu"], e["pid"], e["severity"], e["evidence"])
           for e in replayed]
    assert got == expected
    assert "whole samples" in stderr


def test_the_text_output_is_watchs(tour):
    done = run_cli("replay", str(tour))
    assert done.returncode == 0, done.stderr
    assert "RAISED" in done.stdout and "evidence:" in done.stdout and "fix:" in done.stdout
    assert "next:" in done.stdout


def test_a_recording_without_whole_samples_is_rebuilt_from_its_tables(tour, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(tour, old)
    shutil.rmtree(old / "_snapshots")
    replayed, stderr = replay_json(old)
    assert "rebuilt from its tables" in stderr
    assert "not assessed" in stderr and "no process states" in stderr
    # The GPU-side causes need nothing the tables lack.
    ids = {e["id"] for e in replayed if e["state"] == "raised"}
    assert {"pcie-bound", "throttling", "hardware-errors"} <= ids, ids


def test_damaged_samples_are_skipped_and_named(tour, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(tour, damaged)
    parts = sorted((damaged / "_snapshots").glob("part-*.parquet"))
    parts[0].write_bytes(parts[0].read_bytes()[:100])  # truncated
    rows = pq.read_table(parts[1]).to_pandas()
    rows.loc[0, "snapshot"] = '{"time": "soon", "gpus": 7}'
    rows.loc[1, "snapshot"] = "\x00not json"
    pq.write_table(pa.Table.from_pandas(rows), parts[1])
    replayed, stderr = replay_json(damaged)
    assert f"_snapshots/{parts[0].name}" in stderr and "not a complete Parquet file" in stderr
    assert stderr.count("skipped a sample") == 2
    assert replayed  # the rest is replayed


@pytest.mark.parametrize("make", ["missing", "file", "no-meta", "empty"])
def test_bad_paths_are_one_line(tmp_path, make):
    path = tmp_path / "rec"
    if make == "file":
        path.write_text("x")
    elif make == "no-meta":
        path.mkdir()
    elif make == "empty":
        path.mkdir()
        (path / "_meta.json").write_text("{}")
    done = run_cli("replay", str(path))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


# -- real recordings (H200, driver 580): acceptance 1 of issue 25 ------------------------------


def first_step_time(path) -> float:
    """When the job's first optimizer step was reported (its start-up ends there)."""
    procs = pd.read_parquet(path / "_processes")
    return float(procs.loc[procs["steps"] > 0, "time"].min())


def raised(events: list[dict]) -> list[dict]:
    return [e for e in events if e["state"] == "raised"]


@needs_realgpu
@pytest.mark.parametrize("name, cause", [("starved", "dataloader-stall"),
                                         ("leak", "memory-growth")])
def test_real_recordings_raise_their_jobs_cause(name, cause):
    # The command of the acceptance, as written, from the repository's root.
    events, stderr = replay_json(f"../shared/realgpu/{name}")
    assert cause in {e["id"] for e in raised(events)}, events
    assert "Gen5 x16 taken from NVIDIA H200" in stderr  # the link the rows lack


@needs_realgpu
def test_the_real_healthy_job_raises_no_false_cause():
    events, _ = replay_json(REALGPU / "healthy")
    wrong = [e["id"] for e in raised(events)
             if e["severity"] in WARNING_OR_WORSE and e["id"] != "launch-bound"]
    assert wrong == []


@needs_realgpu
@pytest.mark.parametrize("name", ["healthy", "starved", "leak"])
def test_no_cause_during_a_real_jobs_start_up(name):
    events, _ = replay_json(REALGPU / name)
    start = first_step_time(REALGPU / name)
    early = [(e["id"], e["time"] - start) for e in raised(events) if e["time"] < start]
    assert early == []


# -- the project's own labelled recordings (tests/data/realgpu, H200) ---------------------------

OWN = Path(__file__).parent / "data" / "realgpu"


def own_labels():
    from gputop.recording.accuracy import read_labels_tsv

    return read_labels_tsv(OWN)


def test_the_own_recordings_are_all_labelled():
    names = {label.name for label in own_labels()}
    assert names == {"healthy", "starved", "hostbound", "pcie", "tinykernels", "leak", "sync"}


@pytest.mark.parametrize("label", own_labels(), ids=lambda label: label.name)
def test_each_labelled_real_recording_gets_its_right_finding_and_no_false_alarm(label):
    from gputop.recording.accuracy import score

    outcome = score(label)
    assert outcome.first_step is not None and outcome.samples >= 30
    assert outcome.right, (label.expect, outcome.actionable)
    assert outcome.false_alarms == [], outcome.false_alarms


def test_the_cli_replays_an_own_recording_as_the_scorer_does():
    from gputop.recording.accuracy import score

    label = next(label for label in own_labels() if label.name == "pcie")
    events, stderr = replay_json(OWN / "pcie")
    assert [(e["id"], e["time"]) for e in raised(events)] == [
        (t.finding.id, t.time) for t in score(label).raised]
    assert "whole samples" in stderr
