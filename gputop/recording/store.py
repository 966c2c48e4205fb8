"""Parquet recordings of long runs: written in parts so a killed recorder loses at most one part.

Layout of a recording ``run.parquet/`` (a directory, as Spark and pyarrow datasets write them):

* ``part-000001.parquet`` ...: one row per GPU per sample (``pandas.read_parquet("run.parquet")``
  reads exactly these: pyarrow skips names starting with ``_`` or ``.``);
* ``_processes/part-*.parquet``: one row per training process per sample, with agent telemetry;
* ``_host/part-*.parquet``: one row per sample;
* ``_findings/part-*.parquet``: one row per finding raised or cleared by the live rules;
* ``_snapshots/part-*.parquet``: one row per sample, the whole snapshot as ``snapshot --json``
  (column ``snapshot``, JSON text): every input the live rules read (DRAM activity, the PCIe
  link, process states for the runnable share, agent telemetry), so ``gputop replay`` runs the
  same rules on the same inputs. Recordings made before it have no such table;
* ``_meta.json``: host, driver, GPU models, gputop version, interval.

Each part is written to a hidden temporary file and renamed into place, so every visible part is
complete. Parts are flushed every ``flush_every`` seconds (30 by default): buffers are emptied at
each flush, so the recorder's memory does not grow with the length of the run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gputop import __version__
from gputop.core.efficiency import GOODPUT_KEYS
from gputop.core.model import Efficiency, Snapshot
from gputop.core.snapshot_json import snapshot_to_json
from gputop.recording.untrusted import (
    MAX_TABLE_ROWS,
    UntrustedFile,
    library_message,
    read_json,
    read_parquet,
)

TABLES = ("gpus", "processes", "host", "findings")
_SUBDIR = {"gpus": "", "processes": "_processes", "host": "_host", "findings": "_findings",
           "snapshots": "_snapshots"}
# Written beside TABLES, read only by replay (a report does not need whole snapshots).
SNAPSHOTS = "snapshots"

GPU_COLUMNS = ("util_gpu", "util_mem", "mem_used", "mem_total", "power_w", "power_limit_w",
               "energy_j", "pcie_tx_mbs", "pcie_rx_mbs", "temperature_c", "sm_clock_mhz",
               "sm_clock_max_mhz", "sm_active", "tensor_active", "ecc_volatile")
# Written since the snapshots table; absent from older recordings, so never required.
GPU_EXTRA_COLUMNS = ("sm_occupancy", "dram_active", "pcie_gen", "pcie_width", "pcie_gen_max",
                     "pcie_width_max", "mem_clock_mhz")
COMMAND_CHARS = 300  # a command line is kept this long: enough to name a job, bounded per row
AGENT_COLUMNS = ("steps", "steps_per_s", "step_time_p50_s", "step_time_p95_s",
                 "dataloader_wait_share")
OWNER_COLUMNS = ("runtime", "container_id", "pod_uid", "pod", "namespace", "container",
                 "slurm_job")
# The process's efficiency (gputop.core.efficiency), absent from older recordings.
EFFICIENCY_COLUMNS = ("mfu", "achieved_flops", "peak_flops", "flops_per_step",
                      "samples_per_step", "goodput", "j_per_step", "j_per_sample")
GOODPUT_COLUMNS = {key: f"goodput_{key}_s" for key in GOODPUT_KEYS}
_TEXT_COLUMNS = frozenset({"name", "uuid", "clock_events", "command", "precision", "device",
                           "snapshot", "id", "state", "severity", "title", "evidence", "fix",
                           "next_step", "host", "where", "job", *OWNER_COLUMNS})


class RecordingError(Exception):
    """A recording that cannot be written or read: one line for the user."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write through a hidden temporary file and rename: the file is whole or absent."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def _write_parts(tables: list[tuple[Path, pa.Table]]) -> None:
    """Write the tables of one part: each to a hidden temporary file first, then all renamed
    into place, or none (a full disk fails a write, and a failed rename undoes the ones made
    before it). The GPU table (listed first, the one pandas.read_parquet sees) is renamed last."""
    staged: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for path, table in tables:
            tmp = path.with_name(f".{path.name}.tmp")
            staged.append((tmp, path))
            pq.write_table(table, tmp, compression="zstd")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        for tmp, path in reversed(staged):
            os.replace(tmp, path)
            placed.append(path)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        for path in placed:
            path.unlink(missing_ok=True)
        raise


def gpu_rows(snap: Snapshot) -> list[dict[str, Any]]:
    rows = []
    for g in snap.gpus:
        row: dict[str, Any] = {"time": snap.time, "gpu": g.index, "name": g.name, "uuid": g.uuid,
                               "lost": g.lost, "clock_events": ",".join(g.clock_events)}
        for name in (*GPU_COLUMNS, *GPU_EXTRA_COLUMNS):
            value = getattr(g, name)
            row[name] = None if value is None else float(value)
        rows.append(row)
    return rows


def process_rows(snap: Snapshot) -> list[dict[str, Any]]:
    rows, seen = [], set()
    placed = [(g.index, p) for g in snap.gpus for p in g.processes]
    placed += [(None, p) for p in snap.other_processes]
    for gpu, p in placed:
        if (gpu, p.pid) in seen:
            continue
        seen.add((gpu, p.pid))
        agent = p.agent
        row: dict[str, Any] = {
            "time": snap.time, "pid": p.pid, "gpu": gpu, "name": p.name,
            "command": (p.cmdline or p.name)[:COMMAND_CHARS], "visible": p.visible,
            "cpu_percent": p.cpu_percent, "workers": len(p.workers),
            "workers_cpu_percent": sum(w.cpu_percent or 0.0 for w in p.workers),
            "rss": None if p.rss is None else float(p.rss),
            "gpu_mem": None if p.gpu_mem is None else float(p.gpu_mem),
            "user": p.user,  # whose job: without GPUs, the report takes the recorder's own
        }
        for name in AGENT_COLUMNS:
            value = getattr(agent, name) if agent is not None else None
            row[name] = None if value is None else float(value)
        row.update(_placement(p))
        _efficiency_columns(row, p.efficiency)
        rows.append(row)
    return rows


def _placement(p) -> dict[str, Any]:
    """Where the process runs: its MIG device, its other pid, its container, pod
    and Slurm job (None where unknown; columns absent from older recordings)."""
    owner = p.owner
    return {"gpu_instance": p.gpu_instance, "ns_pid": p.ns_pid, "host_pid": p.host_pid,
            **{key: getattr(owner, key, None) for key in OWNER_COLUMNS}}


def _efficiency_columns(row: dict[str, Any], eff: Efficiency | None) -> None:
    for name in EFFICIENCY_COLUMNS:
        value = getattr(eff, name) if eff is not None else None
        row[name] = None if value is None else float(value)
    row["precision"] = eff.precision if eff is not None else None
    row["device"] = eff.device if eff is not None else None
    seconds = eff.goodput_s if eff is not None else {}
    for key, column in GOODPUT_COLUMNS.items():
        value = seconds.get(key)
        row[column] = None if value is None else float(value)


def host_row(snap: Snapshot) -> dict[str, Any]:
    h = snap.host
    return {"time": snap.time, "cpu_percent": h.cpu_percent, "iowait": h.iowait,
            "memory_used": None if h.memory_used is None else float(h.memory_used),
            "load_1": h.load_1}


_snapshot_encoder = msgspec.json.Encoder()


def snapshot_row(snap: Snapshot) -> dict[str, Any]:
    """The whole snapshot, as the public JSON (msgspec writes NaN as null)."""
    return {"time": snap.time,
            "snapshot": _snapshot_encoder.encode(snapshot_to_json(snap)).decode()}


# The type of every column whatever one part holds: a column with only empty values in a part
# would be typed "null" there, and pyarrow then cannot read the table's parts as one dataset
# (pandas.read_parquet(rec/_processes): "Unsupported cast from double to null").
_INT_COLUMNS = frozenset({"gpu", "pid", "workers", "gpu_instance", "ns_pid", "host_pid", "rank"})
_BOOL_COLUMNS = frozenset({"lost", "visible"})


def _column_type(name: str) -> pa.DataType:
    if name in _INT_COLUMNS:
        return pa.int64()
    if name in _BOOL_COLUMNS:
        return pa.bool_()
    if name in _TEXT_COLUMNS:
        return pa.string()
    return pa.float64()


def typed_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows as a table whose columns have one type in every part (``_column_type``)."""
    table = pa.Table.from_pylist(rows)
    for i, column in enumerate(table.schema):
        want = _column_type(column.name)
        if column.type != want and (pa.types.is_null(column.type)
                                    or pa.types.is_integer(column.type)
                                    or pa.types.is_floating(column.type)):
            try:
                table = table.set_column(i, pa.field(column.name, want),
                                         table.column(i).cast(want))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # keep what it is: the reader checks every part
    return table


@dataclass
class Recorder:
    """Buffers rows and writes them as Parquet parts under ``path``."""

    path: Path
    flush_every: float = 30.0
    _buffers: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {t: [] for t in (*TABLES, SNAPSHOTS)})
    _part: int = 0
    _last_flush: float | None = None
    rows_written: int = 0

    def create(self, meta: dict[str, Any]) -> None:
        """Make the recording directory (it must not hold a recording already) and its meta."""
        try:
            if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
                raise RecordingError(f"{self.path} already exists; choose a new path or remove it")
            for table in (*TABLES, SNAPSHOTS):
                (self.path / _SUBDIR[table]).mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.path / "_meta.json", json.dumps(meta, indent=1).encode())
        except OSError as exc:
            raise RecordingError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def add(self, snap: Snapshot, findings: Iterable[dict[str, Any]] = ()) -> None:
        self._buffers["gpus"].extend(gpu_rows(snap))
        self._buffers["processes"].extend(process_rows(snap))
        self._buffers["host"].append(host_row(snap))
        self._buffers["findings"].extend(findings)
        self._buffers[SNAPSHOTS].append(snapshot_row(snap))
        if self._last_flush is None:
            self._last_flush = snap.time
        if snap.time - self._last_flush >= self.flush_every:
            self.flush(snap.time)

    def flush(self, now: float | None = None) -> None:
        """Write every non-empty buffer as one new part (all its tables or none), then empty
        the buffers. On failure the buffers are kept and no file of the part is left."""
        if not any(self._buffers.values()):
            return
        name = f"part-{self._part + 1:06d}.parquet"
        tables = [(self.path / _SUBDIR[table] / name, typed_table(rows))
                  for table, rows in self._buffers.items() if rows]
        try:
            _write_parts(tables)
        except OSError as exc:
            raise RecordingError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self._part += 1
        self.rows_written += sum(len(rows) for rows in self._buffers.values())
        self._buffers = {t: [] for t in (*TABLES, SNAPSHOTS)}
        self._last_flush = now if now is not None else self._last_flush


def _user_name() -> str | None:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None


def recording_meta(snap: Snapshot, interval: float) -> dict[str, Any]:
    return {
        "gputop_version": __version__,
        "host": snap.host.hostname or socket.gethostname(),
        "started": snap.time,
        "interval_s": interval,
        "driver_version": snap.driver.driver_version,
        "cuda_version": snap.driver.cuda_version,
        "simulated": snap.driver.simulated,
        "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid,
                  "pcie_gen_max": g.pcie_gen_max, "pcie_width_max": g.pcie_width_max}
                 for g in snap.gpus],
        "snapshot_schema": 1,
        "user": _user_name(),  # the recorder's user (not another user's job)
        # The recorder's own pid: the live rules leave its children (a demo's stand-ins) out
        # of job grouping, and a replay must do the same.
        "pid": os.getpid(),
    }


@dataclass
class Recording:
    """A recording read back: one DataFrame per table, the meta, and the parts that could not be
    read (a recorder killed mid-write on a filesystem without atomic rename, a damaged disk)."""

    path: Path
    meta: dict[str, Any]
    gpus: pd.DataFrame
    processes: pd.DataFrame
    host: pd.DataFrame
    findings: pd.DataFrame
    bad_parts: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)  # time ranges no readable sample covers


# Columns a part must have to be summarized (every part this version writes has them).
REQUIRED = {
    "gpus": {"time", "gpu", "name", "lost", "clock_events", *GPU_COLUMNS},
    "processes": {"time", "pid", "gpu", "name", "cpu_percent", "workers", *AGENT_COLUMNS},
    "host": {"time"},
    "findings": {"time"},
    "snapshots": {"time", "snapshot"},
}


# Columns that must hold numbers (or nothing) where a part has them, those that may not be
# empty, and those that must hold text (or nothing): what the summary and the report compute
# and print from. A part that breaks them was not written by gputop (or was damaged): skipped.
NUMERIC = {
    "gpus": {"time", "gpu", *GPU_COLUMNS, *GPU_EXTRA_COLUMNS},
    "processes": {"time", "pid", "gpu", "cpu_percent", "workers", "workers_cpu_percent", "rss",
                  "gpu_mem", *AGENT_COLUMNS},
    "host": {"time", "cpu_percent", "iowait", "memory_used", "load_1"},
    "findings": {"time", "gpu", "pid", "cost_s"},
    "snapshots": {"time"},
}
NOT_EMPTY = {"gpus": {"time", "gpu"}, "processes": {"time", "pid", "workers"},
             "host": {"time"}, "findings": {"time", "id", "severity", "state"},
             "snapshots": {"time", "snapshot"}}
FLAGS = {"gpus": {"lost"}, "processes": {"visible"}}  # True/False (or nothing)
TEXT = {"gpus": {"name", "uuid", "clock_events"}, "processes": {"name", "command", "user"},
        "host": set(), "findings": {"id", "state", "severity", "title", "evidence"},
        "snapshots": {"snapshot"}}
# Sample times a calendar can show: from 1970 to the end of year 9999 (time.localtime's range).
TIME_RANGE = (0.0, 253402300800.0)


def _bad_values(frame: pd.DataFrame, table: str) -> str | None:
    """Why a part's values cannot be summarized (infinite, not numbers, times out of range),
    or None when they can."""
    for column in sorted(NUMERIC[table] & set(frame.columns)):
        values = frame[column]
        if not (pd.api.types.is_numeric_dtype(values) or values.isna().all()):
            return f"column {column} holds {values.dtype} values, not numbers"
        numbers = values.to_numpy(dtype=float, na_value=np.nan)
        if np.isinf(numbers).any():
            return f"column {column} holds an infinite value"
    for column in sorted(NOT_EMPTY[table] & set(frame.columns)):
        if frame[column].isna().any():
            return f"column {column} has empty values"
    times = frame["time"].to_numpy(dtype=float)
    if len(times) and not (TIME_RANGE[0] <= times.min() and times.max() < TIME_RANGE[1]):
        return "times out of range (before 1970 or after 9999)"
    for column in sorted(TEXT[table] & set(frame.columns)):
        values = frame[column]
        if values.dtype == object:  # inferred in C: a Python check per row took seconds
            text = pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty")
        else:
            text = pd.api.types.is_string_dtype(values.dtype) or bool(values.isna().all())
        if not text:
            return f"column {column} holds values that are not text"
    for column in sorted(FLAGS.get(table, set()) & set(frame.columns)):
        values = frame[column]
        kind = pd.api.types.infer_dtype(values, skipna=True)
        if kind not in ("boolean", "empty"):
            return f"column {column} holds {kind} values, not true or false"
    return None


def _read_part(part: Path, root: Path, bad: list[str], table: str) -> pd.DataFrame | None:
    """One part of a table, or None (and its name in ``bad``) when it cannot be read: a part is
    untrusted (``recording.untrusted``: regular, bounded, its footer checked before its data)."""
    try:
        frame = read_parquet(part).to_pandas()
    except UntrustedFile as exc:
        bad.append(f"{part.relative_to(root)} ({exc})")
        return None
    except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
        bad.append(f"{part.relative_to(root)} ({library_message(exc)})")
        return None
    missing = REQUIRED[table] - set(frame.columns)
    if missing:
        bad.append(f"{part.relative_to(root)} (no column {', '.join(sorted(missing))})")
        return None
    why = _bad_values(frame, table)
    if why:
        bad.append(f"{part.relative_to(root)} ({why})")
        return None
    return frame


_PART = re.compile(r"^part-([0-9]{1,9})\.parquet$")
Spans = dict[int, "tuple[float, float] | None"]  # part number -> its time span (None: unread)


def part_number(part: Path) -> int | None:
    found = _PART.match(part.name)
    return int(found.group(1)) if found else None


def _read_table(directory: Path, root: Path, bad: list[str], table: str,
                spans: Spans | None = None) -> pd.DataFrame:
    """Every readable part of one table, up to ``MAX_TABLE_ROWS`` rows; the unreadable ones are
    named in ``bad``. ``spans`` gets each part's time span (None for a part not read)."""
    frames, rows = [], 0
    for part in sorted(directory.glob("part-*.parquet")):
        number = part_number(part)
        frame = None
        if rows >= MAX_TABLE_ROWS:
            bad.append(f"{part.relative_to(root)} (not read: a table is read up to "
                       f"{MAX_TABLE_ROWS} rows)")
        else:
            frame = _read_part(part, root, bad, table)
        if number is not None and spans is not None:
            spans[number] = None if frame is None or frame.empty else (
                float(frame["time"].min()), float(frame["time"].max()))
        if frame is not None:
            frames.append(frame)
            rows += len(frame)
    if not frames:
        return pd.DataFrame()
    # One schema for every part (a column all-null in one part is typed as in the others).
    return pd.concat(frames, ignore_index=True)


def gaps(spans: Spans, where: str) -> list[str]:
    """The runs of parts of a table that are missing (a number skipped) or unreadable, each
    with the time range no sample covers: "gap: no samples from 12:00:30 to 12:01:30 (...)"."""
    if not spans:
        return []
    good = {n: span for n, span in spans.items() if span is not None}
    out, run = [], []
    for n in range(1, max(spans) + 1):
        if n in good:
            if run:
                out.append(_gap_line(run, good, where))
                run = []
        else:
            run.append(n)
    if run:
        out.append(_gap_line(run, good, where))
    return out


def _gap_line(run: list[int], good: dict[int, tuple[float, float]], where: str) -> str:
    before = [good[n][1] for n in good if n < run[0]]
    after = [good[n][0] for n in good if n > run[-1]]
    names = f"part-{run[0]:06d}" + (f" to part-{run[-1]:06d}" if len(run) > 1 else "")
    start = _clock(max(before)) if before else "the start"
    end = _clock(min(after)) if after else "the end"
    return f"gap: no samples from {start} to {end} ({where}{names} missing or unreadable)"


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = read_json(path / "_meta.json")
    except UntrustedFile as exc:
        raise RecordingError(f"cannot read {path / '_meta.json'}: {exc}") from None
    if not isinstance(meta, dict):
        raise RecordingError(f"{path / '_meta.json'} is not a gputop recording's meta "
                             "(a JSON object)")
    gpus = meta.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        meta["gpus"] = []  # only used to name GPU models: an odd value is dropped, not fatal
    return meta


def read_recording(path: Path) -> Recording:
    if not path.is_dir() or not (path / "_meta.json").exists():
        raise RecordingError(f"{path} is not a gputop recording (no {path / '_meta.json'})")
    meta = read_meta(path)
    bad: list[str] = []
    spans: dict[str, Spans] = {t: {} for t in TABLES}
    try:
        tables = {t: _read_table(path / _SUBDIR[t], path, bad, t, spans[t]) for t in TABLES}
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc}") from None
    # A sample has a host row in every part: a part number without one is a gap in time.
    holes = gaps(spans["host"] or spans["gpus"], "_host/" if spans["host"] else "")
    if tables["gpus"].empty and tables["host"].empty:
        why = f"; unreadable: {', '.join(bad)}" if bad else " (nothing was flushed)"
        raise RecordingError(f"{path} holds no readable samples{why}")
    return Recording(path, meta, **tables, bad_parts=bad, gaps=holes)


def snapshot_parts(path: Path) -> list[Path]:
    """The parts of the snapshots table, in the order they were written (empty for
    recordings made before the table existed, and when ``_snapshots`` is not a real folder:
    ``snapshots_refused`` says why)."""
    if snapshots_refused(path) is not None:
        return []
    return sorted((path / _SUBDIR[SNAPSHOTS]).glob("part-*.parquet"))


def snapshots_refused(path: Path) -> str | None:
    """Why the recording's ``_snapshots`` is not read, when it exists but is not a folder of
    its own (a link, a FIFO, a file): None when it is one, or when there is none."""
    where = path / _SUBDIR[SNAPSHOTS]
    try:
        mode = os.lstat(where).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{_SUBDIR[SNAPSHOTS]} cannot be read ({exc.strerror or exc})"
    if stat.S_ISDIR(mode):
        return None
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a file" if stat.S_ISREG(mode) else "not a folder")
    return f"{_SUBDIR[SNAPSHOTS]} is {kind}, not a folder of the recording: not read"


def read_snapshot_part(part: Path, root: Path, bad: list[str]) -> pd.DataFrame:
    """One part of the snapshots table, in time order (empty, and named in ``bad``, when it
    cannot be read): a replay reads them one at a time, so its memory does not grow with the
    length of the recording."""
    frame = _read_part(part, root, bad, SNAPSHOTS)
    if frame is None:
        return pd.DataFrame()
    return frame.sort_values("time", kind="stable", ignore_index=True)


