"""Issue 37, acceptance 2 and 4: hostile recordings, made here from a real one. `report`,
`replay` and `top --replay` run under `ulimit -v` 2 GiB and end with one line (non-zero exit)
or a report that names what it skipped; none hangs on a FIFO, none leaves a traceback.

The time bound of the issue (30 s) is not asserted (a busy machine stretches it); the
subprocess timeout is the generous bound, and the exit and the message are what is checked."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, SLOW, cli_env, run_cli

LIMIT_KIB = 2 * 1024 * 1024  # ulimit -v: 2 GiB of address space
COMMANDS = {"report": ("report",), "replay": ("replay",), "top": ("top", "--replay")}


def limited(*args: str) -> subprocess.CompletedProcess:
    line = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "gputop", *args))
    return subprocess.run(["bash", "-c", f"ulimit -v {LIMIT_KIB}; exec {line}"],
                          capture_output=True, text=True, env=cli_env(), cwd=REPO,
                          stdin=subprocess.DEVNULL, timeout=4 * SLOW)


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    """10 s of a demo, four parts (one per 2.5 s flush)."""
    path = tmp_path_factory.mktemp("hostile-rec") / "run"
    done = run_cli("--demo", "throttled", "--interval", "0.5", "record", "-o", str(path),
                   "--duration", "10", "--flush-every", "2.5")
    assert done.returncode == 0, done.stderr
    assert len(list(path.glob("part-*.parquet"))) >= 4
    return path


def _copy(recording: Path, tmp: Path, name: str) -> Path:
    target = tmp / name
    shutil.copytree(recording, target)
    return target


def _replace(part: Path, table: pa.Table) -> None:
    part.unlink()
    pq.write_table(table, part, compression="zstd")


def _meta_link(path: Path, target: str) -> None:
    (path / "_meta.json").unlink()
    os.symlink(target, path / "_meta.json")


def _meta_fifo(path: Path) -> None:
    (path / "_meta.json").unlink()
    os.mkfifo(path / "_meta.json")


def _meta_text(path: Path, data: bytes) -> None:
    (path / "_meta.json").write_bytes(data)


def _fifo_parts(path: Path) -> None:
    for part in (path / "_snapshots" / "part-000002.parquet", path / "part-000002.parquet"):
        part.unlink()
        os.mkfifo(part)


def _huge_string(path: Path) -> None:
    """A zstd part of a few KB holding one 100 MiB string (snapshots and GPU table; the issue's
    was 400 MiB: the bound is 64 MiB per column chunk, and a smaller one keeps the test quick)."""
    big = "x" * (100 << 20)
    snap = path / "_snapshots" / "part-000002.parquet"
    t = pq.read_table(snap).slice(0, 1)
    _replace(snap, t.set_column(t.schema.get_field_index("snapshot"), "snapshot",
                                pa.array([big])))
    gpu = path / "part-000002.parquet"
    t = pq.read_table(gpu).slice(0, 1)
    _replace(gpu, t.set_column(t.schema.get_field_index("name"), "name", pa.array([big])))
    assert snap.stat().st_size < 1 << 20


def _million_rows(path: Path, snapshots: bool = True) -> None:
    """10^6 GPU rows and 10^6 process rows in a few MB (every part 2 repeated)."""
    for table in (path / "part-000002.parquet", path / "_processes" / "part-000002.parquet"):
        t = pq.read_table(table)
        index = np.resize(np.arange(t.num_rows), 1_000_000)
        _replace(table, t.take(pa.array(index)))
    if not snapshots:  # an older recording's layout: replay rebuilds from the tables
        shutil.rmtree(path / "_snapshots")


def _many_parts(path: Path) -> None:
    """Parts of 150,000 rows each (every one under a part's bound): the table's bound acts."""
    shutil.rmtree(path / "_snapshots")
    t = pq.read_table(path / "part-000001.parquet")
    index = np.resize(np.arange(t.num_rows), 150_000)
    for n in range(5, 11):
        pq.write_table(t.take(pa.array(index)), path / f"part-{n:06d}.parquet",
                       compression="zstd")


def _missing_parts(path: Path) -> None:
    for folder in ("", "_processes", "_host", "_findings", "_snapshots"):
        for n in (2, 3):
            (path / folder / f"part-{n:06d}.parquet").unlink(missing_ok=True)


def _bad_findings(path: Path) -> None:
    rows = [{"time": 1.7e9 + i, "id": bad, "severity": bad, "state": bad, "title": None,
             "evidence": None, "gpu": None, "pid": None, "cost_s": None}
            for i, bad in enumerate((None, float("nan")))]
    frame = pd.DataFrame(rows).astype({"id": object, "severity": object, "state": object})
    folder = path / "_findings"
    folder.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False),
                   folder / "part-000009.parquet")


def _lost_list(path: Path) -> None:
    part = path / "part-000002.parquet"
    t = pq.read_table(part)
    lists = pa.array([[1, 2]] * t.num_rows)
    _replace(part, t.set_column(t.schema.get_field_index("lost"), "lost", lists))


# name: (make it, commands, exit codes allowed, text the output must hold)
CASES = {
    "meta-devzero": (lambda p: _meta_link(p, "/dev/zero"), "report replay top", {1, 2},
                     "not a regular file"),
    "meta-urandom": (lambda p: _meta_link(p, "/dev/urandom"), "report", {1, 2},
                     "not a regular file"),
    "meta-fifo": (_meta_fifo, "report replay top", {1, 2}, "not a regular file"),
    "meta-nested": (lambda p: _meta_text(p, b"[" * 100_000), "report replay top", {1, 2},
                    "nested deeper than 64"),
    "meta-spaces": (lambda p: _meta_text(p, b" " * 100_000), "report", {1, 2},
                    "only white space"),
    "meta-large": (lambda p: _meta_text(p, b" " * (2 << 20)), "replay", {1, 2},
                   "larger than 1.0 MiB"),
    "fifo-parts": (_fifo_parts, "report replay top", {0, 2}, "not a regular file"),
    "huge-string": (_huge_string, "report replay", {0}, "decodes to 100.0 MiB"),
    "million-rows": (_million_rows, "report", {0}, "1000000 rows"),
    "million-rows-tables": (lambda p: _million_rows(p, snapshots=False), "replay", {0},
                            "1000000 rows"),
    "many-parts": (_many_parts, "report replay", {0}, "a table is read up to 400000 rows"),
    "missing-parts": (_missing_parts, "report top", {0, 2}, "gap: no samples from"),
    "bad-findings": (_bad_findings, "report", {0}, "_findings/part-000009.parquet"),
    "lost-list": (_lost_list, "report", {0}, "part-000002.parquet (column lost"),
}


@pytest.fixture(scope="module")
def hostile(recording, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hostile-variants")
    made = {}
    for name, (make, *_rest) in CASES.items():
        made[name] = _copy(recording, tmp, name)
        make(made[name])
    return made


def test_hostile_recordings_end_with_one_line_or_a_report_naming_the_skipped(hostile):
    runs = [(name, command, hostile[name]) for name, (_, commands, _, _) in CASES.items()
            for command in commands.split()]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: limited(*COMMANDS[r[1]], str(r[2])), runs))
    failures = []
    for (name, command, _), done in zip(runs, results):
        _, _, codes, text = CASES[name]
        out = done.stdout + done.stderr
        if ("Traceback" in out or "MemoryError" in out or done.returncode not in codes
                or text not in out):
            failures.append(f"{name} {command}: exit {done.returncode}\n{out[-1500:]}")
        if done.returncode != 0 and command != "top":
            assert len(done.stderr.strip().splitlines()) == 1, (name, command, done.stderr)
    assert not failures, "\n\n".join(failures)


def test_the_missing_parts_gap_has_its_time_range(hostile, recording):
    """Parts 2 and 3 of 4 deleted: the replay says which, and the time they covered."""
    done = limited("replay", str(hostile["missing-parts"]))
    assert done.returncode == 0, done.stderr
    gap = [line for line in done.stderr.splitlines() if "gap:" in line]
    assert len(gap) == 1 and "_snapshots/part-000002 to part-000003" in gap[0], done.stderr
    first, last = gap[0].split("no samples from ")[1].split(" (")[0].split(" to ")
    assert first < last  # "YYYY-mm-dd HH:MM:SS": the range around the missing samples


def test_every_table_reads_as_one_dataset(recording):
    for folder in ("", "_processes", "_host", "_snapshots"):
        frame = pd.read_parquet(recording / folder)
        assert len(frame) > 0, folder
    assert json.loads((recording / "_meta.json").read_text())["interval_s"] == 0.5
