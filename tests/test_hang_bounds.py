"""Hostile dumps and rank numbers are bounded by the job's own shape: a rank past the world
size the dumps (or the environment) agree on is set aside, missing ranks are counted and only a
few listed, and the unpickler stops at its object bound while it reads."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace

import pytest

from gputop.diagnostics.hang import DumpError, attribute, read_dump, read_dump_bytes
from gputop.diagnostics.hang.dumps import FAST_PICKLE_BYTES, MAX_OBJECTS
from gputop.diagnostics.hang.render import format_report
from gputop.diagnostics.hang.world import LISTED, agree
from tests.conftest import DATA, cli_env, run_cli

NCCL = DATA / "fr" / "nccl_h200_inflight" / "nccl_trace_rank_0"  # states its world: 1 rank
GLOO = DATA / "fr" / "gloo_multipg_rank_0"  # states none


def measured_cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """``gputop ARGS`` and its own peak RSS in MB (wait4's rusage of that child alone: the
    test process's other children, other tests' jobs, do not count)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "gputop", *args], stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, env=cli_env())
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            proc.returncode = -1  # reaped here: Popen must not wait on it again
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(proc.args, os.waitstatus_to_exitcode(status),
                                           out.read().decode(), err.read().decode())
    return done, usage.ru_maxrss / 1024


@pytest.mark.parametrize("source", [NCCL, GLOO], ids=["nccl", "gloo"])
def test_a_copy_named_rank_9999999_gives_a_short_report(tmp_path, source):
    shutil.copy(source, tmp_path / "nccl_trace_rank_0")
    shutil.copy(source, tmp_path / "nccl_trace_rank_9999999")
    out, rss_mb = measured_cli("analyze", "--json", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) < 64 * 1024
    data = json.loads(out.stdout)
    assert data["missing_count"] == 0 and data["missing_ranks"] == []
    text = run_cli("analyze", str(tmp_path)).stdout
    assert len(text.splitlines()) < 80
    if source == NCCL:  # its world is 1 rank: the other dump is set aside
        assert data["ranks"] == [0] and data["world_size"] == 1
        assert any("past the job's world size (1)" in n for n in data["notes"])
    else:  # no world stated, and 9999999 from 2 dumps is no world: nothing inferred
        assert data["world_size"] is None
        assert any("not inferred" in n for n in data["notes"])
    assert rss_mb < 1024


def test_missing_ranks_are_counted_and_only_a_few_listed():
    d = read_dump(str(NCCL))
    big = replace(d, pg_config={"0": {"desc": "default_pg", "ranks": list(range(20_000))}})
    world = agree({0: big, 5: replace(big, name="r5", rank=5)})
    assert world.size == 20_000 and len(world.missing) == 19_998
    assert world.listed_missing() == tuple(r for r in range(LISTED + 2) if r not in (0, 5))
    report = attribute({0: big, 5: replace(big, name="r5", rank=5)})
    assert report.missing_count == 19_998 and len(report.missing_ranks) == LISTED
    head = format_report(report).splitlines()[0]
    assert "and 19990 more (19998 ranks)" in head and len(head) < 200


def test_the_environment_s_world_size_bounds_live_ranks():
    # Two processes of another user said RANK=0 and RANK=9999999 with WORLD_SIZE=2.
    d = read_dump(str(GLOO))
    report = attribute({0: d, 9_999_999: replace(d, rank=9_999_999)}, world_size=2)
    assert report.ranks == (0,) and report.missing_ranks == (1,) and report.world_size == 2


def test_a_pickle_of_empty_dicts_stops_at_the_object_bound(tmp_path):
    data = b"\x80\x04(" + b"}" * (32 << 20) + b"l."
    (tmp_path / "nccl_trace_rank_0").write_bytes(data)
    out, rss_mb = measured_cli("analyze", str(tmp_path))
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1 and "object bound" in out.stderr
    assert rss_mb < 1024


def test_a_million_entries_stop_while_reading_and_small_ones_still_read():
    many = pickle.dumps({"entries": [{"profiling_name": "gloo:all_reduce",
                                      "collective_seq_id": i} for i in range(10**6)]})
    assert len(many) > FAST_PICKLE_BYTES
    with pytest.raises(DumpError, match=f"more than {MAX_OBJECTS} objects"):
        read_dump_bytes(many, "many")
    # A ring of 28 000 entries with stacks (a large buffer) reads through the counting reader.
    raw = pickle.loads(GLOO.read_bytes())  # our own test data
    base = raw["entries"]
    raw["entries"] = [{**e, "record_id": i, "frames": [dict(f) for f in e["frames"]]}
                      for i, e in enumerate(base * (28_000 // len(base)))]
    big = pickle.dumps(raw, protocol=2)
    assert len(big) > FAST_PICKLE_BYTES
    assert len(read_dump_bytes(big, "big_rank_0").entries) == len(raw["entries"])
