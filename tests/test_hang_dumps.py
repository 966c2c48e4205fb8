"""`gputop analyze DIR` on real Flight Recorder dumps, and on hostile ones.

Real dumps: 4-rank `torchrun` gloo jobs on CPU (tests/scripts/fr_job.py) in which chosen ranks
fail, each rank dumping its own Flight Recorder buffer (pickle and JSON). The five jobs are
launched once, side by side, for the module. Hostile dumps: a pickle whose __reduce__ would run
os.system, a truncated dump, a 1 GiB dump, damaged JSON; each gets one line and exit 2, and
nothing runs.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.diagnostics.hang.dumps import DumpError, read_dump, read_dump_bytes
from tests.conftest import DATA, REPO, SLOW, cli_env, end_popen, run_cli

JOB = REPO / "tests" / "scripts" / "fr_job.py"
SCENARIOS = ("sleep", "desync", "killed", "multipg", "healthy")
FORMS = ("pickle", "json")
REAL_DUMP = DATA / "fr" / "gloo_multipg_rank_0"


def _torchrun() -> str | None:
    found = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return found or shutil.which("torchrun")


@pytest.fixture(scope="module")
def fr_dumps(tmp_path_factory, share_process):
    """scenario -> folder with pickle/ and json/ dumps of its 4 ranks, from one torchrun launch
    each, all five launched at once."""
    torchrun = _torchrun()
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    root = tmp_path_factory.mktemp("fr-dumps")
    env = cli_env(TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1")
    procs = {}
    for name in SCENARIOS:
        log = (root / f"{name}.log").open("w")
        procs[name] = share_process(subprocess.Popen(
            [torchrun, "--standalone", "--monitor-interval", "1", "--nproc-per-node", "4",
             str(JOB), name, str(root / name)], stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=root))
    try:
        for proc in procs.values():
            proc.wait(timeout=SLOW * 2)
    finally:
        for proc in procs.values():
            end_popen(proc)
    for name in SCENARIOS:
        expected = 3 if name == "killed" else 4
        for form in FORMS:
            got = sorted(os.listdir(root / name / form)) if (root / name / form).is_dir() else []
            log = (root / f"{name}.log").read_text()[-3000:]
            assert len(got) == expected, (name, form, got, log)
    return root


def _analyze_json(folder: Path) -> dict:
    out = run_cli("analyze", "--json", str(folder))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    return json.loads(lines[0])


def _first(report: dict, fid: str) -> dict:
    return next(f for f in report["findings"] if f["id"] == fid)


@pytest.mark.parametrize("form", FORMS)
def test_a_sleeping_rank_is_named_with_the_collective_and_its_sequence(fr_dumps, form):
    report = _analyze_json(fr_dumps / "sleep" / form)
    assert report["verdict"] == "hang"
    hang = _first(report, "hang")
    assert hang["ranks"] == [2]
    assert hang["waiting_ranks"] == [0, 1, 3]
    assert hang["collective"] == "gloo:all_reduce"
    assert hang["process_group"] == {"id": "0", "desc": "default_pg"}
    assert hang["seq"] == 6  # 5 all_reduce steps before the scenario's point
    assert hang["since_s"] is not None and hang["since_s"] >= 0
    if form == "pickle":  # only the pickle has stacks: the waiting ranks' call site
        assert "fr_job.py:" in hang["where_by_rank"]["0"]


def test_the_text_report_says_who_never_reached_what(fr_dumps):
    out = run_cli("analyze", str(fr_dumps / "sleep" / "pickle"))
    assert out.returncode == 0, out.stderr
    assert "rank 2 never reached all_reduce #6 of default_pg; 3 other ranks in 1 group wait " \
        "because of it" in " ".join(out.stdout.split())
    assert "verdict: hang" in out.stdout


@pytest.mark.parametrize("form", FORMS)
def test_a_desync_names_the_rank_and_shows_both_calls(fr_dumps, form):
    report = _analyze_json(fr_dumps / "desync" / form)
    assert report["verdict"] == "desync"
    desync = _first(report, "desync")
    assert desync["ranks"] == [0]
    assert desync["waiting_ranks"] == [1, 2, 3]
    assert desync["seq"] == 6
    calls = {c["call"].split()[0]: c["ranks"] for c in desync["calls"]}
    assert calls == {"gloo:all_reduce": [1, 2, 3], "gloo:all_gather": [0]}


@pytest.mark.parametrize("form", FORMS)
def test_a_killed_rank_is_named_although_it_left_no_dump(fr_dumps, form):
    report = _analyze_json(fr_dumps / "killed" / form)
    assert report["verdict"] == "hang"
    assert report["missing_ranks"] == [3]
    hang = _first(report, "hang")
    assert hang["ranks"] == [3]
    assert hang["no_dump"] == [3]
    assert hang["collective"] == "gloo:all_reduce"
    assert hang["seq"] == 6


@pytest.mark.parametrize("form", FORMS)
def test_several_process_groups_name_the_group_the_rank_never_reached(fr_dumps, form):
    report = _analyze_json(fr_dumps / "multipg" / form)
    assert report["verdict"] == "hang"
    hang = report["findings"][0]
    assert hang["id"] == "hang"
    assert hang["ranks"] == [3]
    assert hang["process_group"]["desc"] == "DATA_PARALLEL_GROUP"
    assert hang["waiting_ranks"] == [0, 1, 2]  # every other rank waits, none is a cause
    assert hang["seq"] == 6
    # The world's all_reduce also waits on rank 3 and on rank 1, which is late there only
    # because it waits in the data-parallel group: a symptom of the one cause.
    world = next(s for s in hang["symptoms"] if s["process_group"]["desc"] == "default_pg")
    assert world["because_of"] == [1, 3] and world["waiting_ranks"] == [0, 2]
    assert [f["id"] for f in report["findings"]] == ["hang"]
    descs = sorted({g["desc"] for g in report["process_groups"]})
    assert descs == ["DATA_PARALLEL_GROUP", "TENSOR_PARALLEL_GROUP", "default_pg"]


@pytest.mark.parametrize("form", FORMS)
def test_a_job_that_finished_is_healthy(fr_dumps, form):
    report = _analyze_json(fr_dumps / "healthy" / form)
    assert report["verdict"] == "healthy"
    assert report["findings"] == []
    assert report["healthy_reason"].startswith("no collective in flight")


def test_dump_files_named_one_by_one_are_one_job(fr_dumps):
    files = sorted(str(p) for p in (fr_dumps / "sleep" / "pickle").iterdir())
    out = run_cli("analyze", "--json", *files)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["findings"][0]["ranks"] == [2]


def test_dumps_are_told_from_traces_by_content_not_name(fr_dumps, tmp_path):
    # A dump named like a trace is still a dump; a trace beside dumps still a trace.
    folder = tmp_path / "mixed"
    folder.mkdir()
    for p in (fr_dumps / "sleep" / "json").iterdir():
        shutil.copy(p, folder / p.name)
    out = run_cli("analyze", "--json", str(folder))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["verdict"] == "hang"


# -- hostile dumps -----------------------------------------------------------------------------

class _Evil:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _one_error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputop: error: "), out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_pickle_that_would_run_a_command_runs_nothing(tmp_path, wrapped):
    target = tmp_path / "pwned"
    payload = _Evil(str(target))
    obj = {"version": "2.10", "pg_config": {}, "entries": [payload]} if wrapped else payload
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "nccl_trace_rank_0").write_bytes(pickle.dumps(obj))
    line = _one_error_line(run_cli("analyze", "--json", str(folder)))
    assert "refused" in line and "system" in line
    # in this process too
    with pytest.raises(DumpError):
        read_dump(str(folder / "nccl_trace_rank_0"))
    assert not target.exists()


def test_a_pickle_of_any_class_is_refused(tmp_path):
    import collections

    data = pickle.dumps({"entries": [], "pg_config": collections.OrderedDict()})
    with pytest.raises(DumpError, match="refused"):
        read_dump_bytes(data, "fr_0")


def test_a_truncated_dump_gets_one_line(tmp_path):
    data = REAL_DUMP.read_bytes()
    (tmp_path / "fr_trace_rank_0").write_bytes(data[: len(data) // 2])
    line = _one_error_line(run_cli("analyze", str(tmp_path)))
    assert "fr_trace_rank_0" in line and "truncated" in line


def test_a_1_gib_dump_is_refused_unread_by_the_size_bound(tmp_path):
    path = tmp_path / "fr_trace_rank_0"
    with path.open("wb") as fh:  # a real dump's start, then a hole to 1 GiB (sparse: quick)
        fh.write(REAL_DUMP.read_bytes())
        fh.truncate(2**30)
    line = _one_error_line(run_cli("analyze", "--json", str(tmp_path)))
    assert "1024 MiB is over the dump size bound (256 MiB)" in line
    line = _one_error_line(run_cli("analyze", str(path)))  # named on its own too
    assert "over the dump size bound" in line


def test_damaged_json_and_deep_nesting_get_one_line(tmp_path):
    (tmp_path / "fr_0.json").write_text('{"pg_config": {}, "entries": [' + "[" * 200000)
    (tmp_path / "fr_1.json").write_text('{"pg_config": {}, "entries": [{"profiling_name": 1}]}')
    out = run_cli("analyze", "--json", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr  # one line per damaged dump
    assert all(ln.startswith("gputop: error: ") for ln in lines)


def test_a_fifo_is_not_read(tmp_path):
    fifo = tmp_path / "fr_trace_rank_0"
    os.mkfifo(fifo)
    with pytest.raises(DumpError, match="not a regular file"):
        read_dump(str(fifo))


def test_the_committed_real_dump_reads_in_both_forms():
    a = read_dump(str(REAL_DUMP))
    b = read_dump(str(REAL_DUMP) + ".json")
    assert a.rank == b.rank == 0
    assert a.form == "pickle" and b.form == "json"
    assert [(e.pg_id, e.seq, e.op) for e in a.entries] == \
        [(e.pg_id, e.seq, e.op) for e in b.entries]
    assert any(e.frames for e in a.entries)  # the pickle carries stacks
    assert a.dumped_at and a.dumped_at <= time.time() + 1


def test_a_pickle_sharing_one_object_everywhere_is_read_once_and_bounded():
    # References make a small pickle name one big list from every entry and group: each shared
    # object is read once, and the groups' rank lists share one budget.
    ranks = list(range(100_000))
    entry = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 1,
             "process_group": ("0", "default_pg"),
             "frames": [{"name": "f", "filename": "train.py", "line": 1}] * 1000}
    data = pickle.dumps({"entries": [entry] * 200_000,
                         "pg_config": {str(i): {"desc": "x", "ranks": ranks} for i in range(4096)}})
    assert len(data) < 2**20
    d = read_dump_bytes(data, "fr_trace_rank_0")
    assert len(d.entries) == 200_000 and len(d.entries[0].frames) == 64
    assert sum(1 for v in d.pg_config.values() if v["ranks"]) <= 11
