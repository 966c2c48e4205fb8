"""A `gputop record` directory read back as the snapshots it recorded, in time order, for
`gputop replay` and `gputop top --replay`.

A recording with a ``_snapshots`` table holds every sample whole (the ``snapshot --json``
text): each is decoded as a node's stream sample is (``snapshot_json.decode_snapshot``: typed,
bounded, escaped), part by part, so memory does not grow with the recording. An older recording
(GPU rows, ``_processes`` with agent columns, ``_host``) is rebuilt from its tables into the
same JSON and decoded the same way; what it lacks (the PCIe link, DRAM activity, process states
and start times, the workers' own pids) stays unknown, and the live rules say what they could
not assess (``diagnostics.live.coverage``). Everything in a recording is untrusted: a part that
cannot be read or a row that does not decode is skipped and named, never a traceback.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pandas as pd

from gputop.core.model import GpuSample, Snapshot
from gputop.core.snapshot_json import MAX_GPUS, MAX_PROCESSES, WireError, decode_snapshot, one_line
from gputop.core.validate import number
from gputop.recording.store import (
    AGENT_COLUMNS,
    GPU_COLUMNS,
    GPU_EXTRA_COLUMNS,
    Recording,
    RecordingError,
    Spans,
    gaps,
    part_number,
    read_meta,
    read_recording,
    read_snapshot_part,
    snapshot_parts,
    snapshots_refused,
)
from gputop.recording.untrusted import part_rows

_num = partial(number, parse=True)  # a cell of an older recording's table
MAX_NOTES = 20  # skipped rows are named up to this many, then counted
_INT_FIELDS = {name for name, kind in typing.get_type_hints(GpuSample).items()
               if kind == int | None}
_encoder = msgspec.json.Encoder()


@dataclass
class Replay:
    """An opened recording: its header, where its snapshots come from, and what was skipped."""

    path: Path
    meta: dict[str, Any]
    source: str  # "snapshots" (whole samples) or "tables" (rebuilt from an older recording)
    count: int  # snapshots it holds (before any is skipped)
    problems: list[str] = field(default_factory=list)  # parts and rows that were skipped
    # Why the samples are rebuilt from the tables (source "tables").
    tables_why: str = "recorded before gputop kept whole samples"
    _skipped: int = 0
    _tables: Recording | None = None  # an older recording's tables, read once

    @property
    def host(self) -> str:
        return one_line(self.meta.get("host") or "?", 100)

    @property
    def own_pid(self) -> int | None:
        """The recorder's pid (its children, a demo's stand-ins, are no job's ranks)."""
        pid = self.meta.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None

    @property
    def interval(self) -> float:
        value = self.meta.get("interval_s")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok and 0.01 <= value <= 3600 else 1.0

    def snapshots(self) -> Iterator[Snapshot]:
        """Every snapshot, in time order; one whose time does not move forward is skipped."""
        last = -math.inf
        rows = self._from_snapshots() if self.source == "snapshots" else self._from_tables()
        for data in rows:
            try:
                snap = decode_snapshot(data)
            except WireError as exc:
                self._skip(f"a sample that does not decode: {exc}")
                continue
            if not math.isfinite(snap.time) or snap.time <= last:
                self._skip(f"a sample out of time order (at {snap.time})")
                continue
            last = snap.time
            yield snap

    def _skip(self, why: str) -> None:
        self._skipped += 1
        if self._skipped <= MAX_NOTES:
            self.problems.append(f"skipped {why}")
        elif self._skipped == MAX_NOTES + 1:
            self.problems.append("skipped more samples (not named)")

    def _from_snapshots(self) -> Iterator[bytes]:
        spans: Spans = {}
        for part in snapshot_parts(self.path):
            frame = read_snapshot_part(part, self.path, self.problems)
            number = part_number(part)
            if number is not None:
                spans[number] = None if frame.empty else (float(frame["time"].min()),
                                                          float(frame["time"].max()))
            for text in frame["snapshot"] if not frame.empty else ():
                if isinstance(text, str):
                    yield text.encode()
                elif isinstance(text, bytes):
                    yield text
                else:
                    self._skip("a sample that is not JSON text")
        # Parts missing (a number skipped) or unreadable: the time they leave without samples.
        self.problems.extend(gaps(spans, "_snapshots/"))

    def _from_tables(self) -> Iterator[bytes]:
        rec, self._tables = self._tables or read_recording(self.path), None
        self.problems.extend(rec.bad_parts + rec.gaps)
        yield from rebuilt_snapshots(rec.meta, rec.gpus, rec.processes, rec.host)


def open_replay(path: Path) -> Replay:
    """Open ``path`` for replay; raises ``RecordingError`` (one line) when it is not a
    recording or holds nothing to replay."""
    if not path.is_dir() or not (path / "_meta.json").exists():
        raise RecordingError(f"{path} is not a gputop recording (no {path / '_meta.json'})")
    meta = read_meta(path)
    parts = snapshot_parts(path)
    if parts:
        # The footers only, each file checked first (a FIFO is not opened to wait on it).
        count = sum(part_rows(part) or 0 for part in parts)
        return Replay(path, meta, "snapshots", count)
    refused = snapshots_refused(path)
    try:
        rec = read_recording(path)  # raises when it holds no readable samples
    except RecordingError as exc:
        raise RecordingError(f"{exc} ({refused})" if refused else str(exc)) from None
    times = set(rec.gpus["time"]) if "time" in rec.gpus else set()
    times |= set(rec.host["time"]) if "time" in rec.host else set()
    replay = Replay(path, meta, "tables", len(times), _tables=rec)
    if refused:
        replay.problems.append(f"{refused}; the samples are rebuilt from the tables")
        replay.tables_why = refused
    return replay


# -- older recordings: snapshots rebuilt from the tables ---------------------------------------


def _rows_by_time(frame) -> dict[float, Any]:
    """Row positions of each sample time (the rows themselves are made one sample at a time,
    so a large table is never turned into dicts all at once)."""
    if frame.empty or "time" not in frame:
        return {}
    times = pd.to_numeric(frame["time"], errors="coerce")
    return {float(t): positions for t, positions in times.groupby(times).indices.items()
            if _num(t) is not None}


def _records(frame, positions, limit: int) -> list[dict[str, Any]]:
    if positions is None:
        return []
    return frame.iloc[positions[:limit]].to_dict("records")


def _gpu_json(row: dict[str, Any]) -> dict[str, Any]:
    events = row.get("clock_events")
    data: dict[str, Any] = {
        "index": _num(row.get("gpu"), integer=True),
        "name": row.get("name") if isinstance(row.get("name"), str) else None,
        "uuid": row.get("uuid") if isinstance(row.get("uuid"), str) else None,
        "lost": bool(row.get("lost")) if row.get("lost") is not None else False,
        "clock_events": [e for e in events.split(",") if e] if isinstance(events, str) else [],
    }
    for name in (*GPU_COLUMNS, *GPU_EXTRA_COLUMNS):
        if name in row:
            data[name] = _num(row[name], integer=name in _INT_FIELDS)
    return data


def _process_json(row: dict[str, Any]) -> dict[str, Any]:
    """A process row as the snapshot's JSON: its workers only by count and total CPU (each
    gets the mean), no pid of their own; the agent's columns as its telemetry."""
    n_workers = _num(row.get("workers"), integer=True) or 0
    n_workers = max(0, min(n_workers, MAX_PROCESSES))
    total = _num(row.get("workers_cpu_percent")) or 0.0
    workers = [{"pid": 0, "name": "worker", "cpu_percent": total / n_workers, "rss": None,
                "state": ""} for _ in range(n_workers)]
    agent = {name: _num(row.get(name), integer=name == "steps") for name in AGENT_COLUMNS}
    agent = {k: v for k, v in agent.items() if v is not None}
    name = row.get("name") if isinstance(row.get("name"), str) else "?"
    command = row.get("command") if isinstance(row.get("command"), str) else ""
    data = {
        "pid": _num(row.get("pid"), integer=True),
        "name": name,
        "cmdline": command,
        "visible": bool(row.get("visible", True)),
        "cpu_percent": _num(row.get("cpu_percent")),
        "rss": _num(row.get("rss"), integer=True),
        "gpu_mem": _num(row.get("gpu_mem"), integer=True),
        "workers": workers,
    }
    if agent:
        data["agent"] = agent
    return data


def rebuilt_snapshots(meta: dict[str, Any], gpus, processes, host) -> Iterator[bytes]:
    """The ``snapshot --json`` text of every sample of an older recording's tables."""
    gpu_rows, proc_rows, host_rows = (_rows_by_time(gpus), _rows_by_time(processes),
                                      _rows_by_time(host))
    hostname = meta.get("host") if isinstance(meta.get("host"), str) else "?"
    driver = {"available": bool(gpu_rows) or bool(meta.get("driver_version")),
              "driver_version": _text(meta.get("driver_version")),
              "cuda_version": _text(meta.get("cuda_version")),
              "simulated": _text(meta.get("simulated"))}
    for t in sorted(set(gpu_rows) | set(host_rows)):
        h = (_records(host, host_rows.get(t), 1) or [{}])[0]
        by_gpu: dict[int | None, list[dict[str, Any]]] = {}
        # More rows than a sample may hold are not made into dicts: the sample is refused.
        for row in _records(processes, proc_rows.get(t), MAX_PROCESSES * 2):
            gpu = _num(row.get("gpu"), integer=True)
            by_gpu.setdefault(gpu, []).append(_process_json(row))
        gpus_json = []
        for row in _records(gpus, gpu_rows.get(t), MAX_GPUS + 1):
            data = _gpu_json(row)
            data["processes"] = by_gpu.get(data["index"], [])
            gpus_json.append(data)
        yield _encoder.encode({
            "time": t,
            "host": {"hostname": hostname, **{k: _num(h.get(k)) for k in
                                               ("cpu_percent", "iowait", "load_1")},
                     "memory_used": _num(h.get("memory_used"), integer=True)},
            "driver": driver,
            "gpus": gpus_json,
            "processes": by_gpu.get(None, []),
        })


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
