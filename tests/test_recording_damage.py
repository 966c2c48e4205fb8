"""A damaged recording: `gputop report` reads what is good and names what is not, in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "run"
    done = run_cli("--demo", "tour", "record", "-o", str(out), "--duration", "5",
                   "--flush-every", "1")
    assert done.returncode == 0, done.stderr
    assert len(list(out.glob("part-*.parquet"))) >= 3
    return out


@pytest.fixture
def damaged(recording, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(recording, copy)
    return copy


def test_a_truncated_and_an_empty_part_are_skipped_and_named(damaged):
    parts = sorted(damaged.glob("part-*.parquet"))
    data = parts[1].read_bytes()
    parts[1].write_bytes(data[: len(data) // 2])
    (damaged / "_processes" / parts[0].name).write_bytes(b"")
    done = run_cli("report", str(damaged), "--json")
    assert done.returncode == 0, done.stderr
    warning = done.stderr.strip().splitlines()
    assert len(warning) == 1 and "skipped 2 unreadable part(s)" in warning[0]
    assert parts[1].name in warning[0] and f"_processes/{parts[0].name}" in warning[0]
    summary = json.loads(done.stdout)
    assert len(summary["gpus"]) == 10  # the rest is reported
    assert all(g["samples"] >= 2 for g in summary["gpus"])


def test_a_part_without_the_columns_is_skipped(damaged):
    parts = sorted(damaged.glob("part-*.parquet"))
    shutil.copy(sorted((damaged / "_host").glob("part-*.parquet"))[0], parts[0])
    done = run_cli("report", str(damaged))
    assert done.returncode == 0, done.stderr
    assert "no column" in done.stderr and parts[0].name in done.stderr


@pytest.mark.parametrize("meta", ["[1, 2]", "\"text\"", "{", "", "{\"gpus\": 7}"])
def test_a_bad_meta_is_one_line_never_a_traceback(damaged, meta):
    (damaged / "_meta.json").write_text(meta)
    done = run_cli("report", str(damaged))
    assert "Traceback" not in done.stderr
    if meta == "{\"gpus\": 7}":  # an object with an odd field: still a report
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1 and "_meta.json" in done.stderr


def test_nothing_readable_is_one_line(damaged):
    for part in [*damaged.glob("part-*.parquet"), *damaged.glob("_host/part-*.parquet")]:
        part.write_bytes(b"PAR1 not really")
    done = run_cli("report", str(damaged))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no readable samples" in lines[0]
