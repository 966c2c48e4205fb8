"""A damaged recording: `gputop report` reads what is good and names what is not, in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gputop.core.agent_status import parse_status
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot
from gputop.recording.store import Recorder, RecordingError
from gputop.sim.scenarios import SCENARIOS
from tests.conftest import run_cli, small_tmpfs


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
    warnings = done.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("gputop: warning: skipped ") for w in warnings)
    assert warnings[0].endswith(f"/{parts[1].name} (not a complete Parquet file)"), warnings
    assert f"_processes/{parts[0].name}" in warnings[1], warnings
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


def _rewrite(part: Path, column: str, values) -> None:
    table = pq.read_table(part)
    index = table.column_names.index(column)
    table = table.set_column(index, column, pa.array(values(table.num_rows)))
    pq.write_table(table, part)


def test_parts_with_values_out_of_range_are_skipped_one_warning_each(damaged):
    """Times of inf, -1e18 and text, and an infinite metric: each such part is skipped with a
    warning that names it and says why; the rest is reported, as text, JSON and HTML."""
    gpus = sorted(damaged.glob("part-*.parquet"))
    host = sorted((damaged / "_host").glob("part-*.parquet"))
    procs = sorted((damaged / "_processes").glob("part-*.parquet"))
    _rewrite(gpus[0], "time", lambda n: [float("inf")] * n)
    _rewrite(gpus[1], "util_gpu", lambda n: [float("inf")] * n)
    _rewrite(host[1], "time", lambda n: [-1e18] * n)
    _rewrite(procs[2], "time", lambda n: ["2024-01-01 10:00"] * n)
    expected = {gpus[0].name: "column time holds an infinite value", gpus[1].name: "column util_gpu holds an "
                "infinite value", f"_host/{host[1].name}": "times out of range",
                f"_processes/{procs[2].name}": "column time holds"}
    for args in ([], ["--json"], ["--html", str(damaged.parent / "report.html")]):
        done = run_cli("report", str(damaged), *args)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr + done.stdout
        warnings = [line for line in done.stderr.splitlines() if "warning: skipped" in line]
        assert len(warnings) == len(expected), warnings
        # The unreadable host part leaves a gap in time, named with its range (issue 37).
        holes = [line for line in done.stderr.splitlines() if "gap: no samples from" in line]
        assert len(holes) == 1 and f"_host/{host[1].name[:-8]} missing" in holes[0], holes
        for part, why in expected.items():
            assert sum(f"{damaged}/{part} ({why}" in w for w in warnings) == 1, (part, warnings)
        if not args:
            assert done.stdout.startswith(f"recording {damaged}") and "GPU" in done.stdout
    assert len(json.loads(run_cli("report", str(damaged), "--json").stdout)["gpus"]) == \
        len(SCENARIOS["tour"].gpus)


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: room for a few parts of a recording, then no space left."""
    with small_tmpfs(tmp_path / "small", "256k") as mount:
        yield mount


def _snapshot(t: float) -> Snapshot:
    procs = tuple(ProcSample(pid=1000 + i, name="python", cmdline=f"python train.py --rank {i}",
                             cpu_percent=99.0, gpu_mem=1 << 34, agent=parse_status({"steps": int(t)}))
                  for i in range(4))
    gpus = tuple(GpuSample(index=i, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{i}", util_gpu=97.0,
                           mem_used=60 << 30, mem_total=80 << 30, power_w=600.0 + t % 7,
                           processes=procs[i % 4:i % 4 + 1]) for i in range(8))
    return Snapshot(time=1.7e9 + t, host=HostSample("node", cpu_percent=50.0),
                    driver=DriverInfo(True, "570.1", "12.8"), gpus=gpus)


def test_a_full_disk_leaves_whole_parts_only(small_disk):
    """Each part is all its tables or none: when the disk fills up mid-part, no table of that
    part is left (the GPU rows without their host, processes and snapshot rows, say), and no
    temporary file either; what was flushed before is a readable recording."""
    recorder = Recorder(small_disk / "run", flush_every=0.0)
    recorder.create({"host": "node", "gpus": [], "interval_s": 1.0})
    with pytest.raises(RecordingError, match="No space left"):
        for t in range(100_000):
            recorder.add(_snapshot(float(t)))
    tables = {sub: {p.name for p in (small_disk / "run" / sub).glob("part-*.parquet")}
              for sub in ("", "_processes", "_host", "_snapshots")}
    assert tables[""], "no part was flushed before the disk filled"
    assert all(names == tables[""] for names in tables.values()), tables
    assert not list((small_disk / "run").rglob(".*.tmp"))
    done = run_cli("report", str(small_disk / "run"), "--json",
                   "--metrics", str(small_disk.parent / "metrics.json"))
    assert done.returncode == 0 and not done.stderr, done.stderr
