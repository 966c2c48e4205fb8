"""One rank's torch.compile log folded into what the findings need: its compiles (function,
place, seconds, the guard that failed for a recompile, the recompile limit), its graph breaks
(reason, user line, count) and each compiled graph's collective schedule.

Every field of a record is untrusted: a wrong type is ignored, text is cleaned and bounded,
lists are capped (``MAX_COMPILES`` and friends), so a log of any length holds bounded memory.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from gputop.core.guard_change import change, clean, root_function
from gputop.diagnostics.compile_log.read import ReadStats, Record, records

MAX_COMPILES = 20_000
MAX_BREAKS = 256
MAX_GRAPHS = 10_000
MAX_FILES = 100_000  # entries of the log's string table (file names)

_LIMIT = re.compile(r"recompile.?limit|cache.?size.?limit", re.IGNORECASE)
_LIMIT_SET = re.compile(r'"(?:recompile_limit|cache_size_limit)": (\d{1,9})')
_RANK_IN_NAME = re.compile(r"rank_(\d{1,6})(?:\D|$)")
_BREAK_AT = re.compile(r"Graph break in user code at (?P<file>.{1,500}?):(?P<line>\d{1,7})\s*$")
_FILE_LINE = re.compile(r'^\s*File "(?P<file>.{1,500})", line (?P<line>\d{1,7}), in (?P<fn>.{1,200})$')
_COLLECTIVE = re.compile(r'(?:"(?P<shape>[a-z0-9]{1,12}\[[\d, ]{0,200}\])[^"]{0,200}"\s*=\s*)?'
                         r"torch\.ops\._c10d_functional\.(?P<op>\w{1,80}?)_?(?:\.default)?\("
                         r"(?P<args>[^)]{0,300})")
_SCHEDULED = re.compile(r"_c10d_functional\.(?P<op>\w{1,80}?)_?(?:\.default)?$")


@dataclass
class Compile:
    compile_id: str
    frame: str
    attempt: int  # the frame's compile number: 0 the first, 1.. its recompiles
    function: str
    file: str
    line: int | None
    seconds: float
    start: float | None
    recompile: dict[str, Any] | None = None  # change() of the guard that failed
    fallback: bool = False  # this attempt hit the recompile limit: the frame runs eager
    failed: str | None = None


@dataclass
class Break:
    reason: str
    file: str
    line: int | None
    function: str
    code: str
    count: int = 0


@dataclass
class RankLog:
    path: str
    rank: int | None
    stats: ReadStats
    compiles: list[Compile] = field(default_factory=list)
    compiles_dropped: int = 0
    breaks: dict[tuple[str, str, int | None], Break] = field(default_factory=dict)
    # compile id -> the collectives of its graph, in program order ("all_reduce f32[4] sum")
    schedules: dict[str, list[str]] = field(default_factory=dict)
    torch_version: str | None = None
    recompile_limit: int | None = None

    @property
    def compile_s(self) -> float:
        return sum(c.seconds for c in self.compiles)


def _int(value: Any, hi: int = 2**31) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        0 <= value < hi else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value) if 0 <= value < 1e12 else None


def _wants(data: dict[str, Any]) -> str | None:
    if "dynamo_output_graph" in data:
        return "c10d"
    artifact = data.get("artifact")
    name = artifact.get("name") if isinstance(artifact, dict) else None
    if name in ("recompile_reasons", "dynamo_graph_break_reason",
                "inductor_collective_schedule", "torch_version"):
        return "text"
    return None


def rank_of(path: str) -> int | None:
    m = _RANK_IN_NAME.search(os.path.basename(path))
    return int(m.group(1)) if m else None


class _Builder:
    def __init__(self, log: RankLog) -> None:
        self.log = log
        self.files: dict[int, str] = {}
        self.frames: dict[str, tuple[str, str, int | None]] = {}  # frame id -> name, file, line
        self.reasons: dict[str, str] = {}  # compile id -> its recompile_reasons payload
        self.inductor: dict[str, list[str]] = {}

    def ids(self, data: dict[str, Any]) -> tuple[str, int]:
        frame, attempt = _int(data.get("frame_id")), _int(data.get("frame_compile_id"))
        return (str(frame) if frame is not None else "?", attempt if attempt is not None else 0)

    def add(self, rec: Record) -> None:
        data = rec.data
        if self.log.rank is None and _int(data.get("rank"), 1 << 20) is not None:
            self.log.rank = data["rank"]
        if "str" in data:
            entry = data["str"]
            if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and _int(entry[1]) is not None and len(self.files) < MAX_FILES):
                self.files[entry[1]] = clean(entry[0], 500)
        elif "dynamo_start" in data:
            self.start(data)
        elif "compilation_metrics" in data:
            self.metrics(data)
        elif "dynamo_output_graph" in data and rec.payload:
            self.graph(data, rec.payload)
        elif isinstance(data.get("artifact"), dict):
            self.artifact(data, rec.payload)

    def start(self, data: dict[str, Any]) -> None:
        body = data["dynamo_start"]
        stack = body.get("stack") if isinstance(body, dict) else None
        if not isinstance(stack, list) or not stack or not isinstance(stack[-1], dict):
            return
        top = stack[-1]
        file_id = _int(top.get("filename"))
        file = self.files.get(file_id, "?") if file_id is not None else clean(top.get("filename"), 500)
        frame, _ = self.ids(data)
        if len(self.frames) < MAX_COMPILES:
            self.frames[frame] = (clean(top.get("name"), 120) or "?", file, _int(top.get("line")))

    def metrics(self, data: dict[str, Any]) -> None:
        m = data["compilation_metrics"]
        if not isinstance(m, dict):
            return
        frame, attempt = self.ids(data)
        cid = clean(m.get("compile_id"), 40) or f"{frame}/{attempt}"
        known = self.frames.get(frame, ("?", "?", None))
        name = clean(m.get("co_name"), 120) or known[0]
        file = clean(m.get("co_filename"), 500) or known[1]
        line = _int(m.get("co_firstlineno")) if m.get("co_firstlineno") is not None else known[2]
        fail = clean(m.get("fail_reason"), 300) if isinstance(m.get("fail_reason"), str) else None
        full_fail = m.get("fail_reason") if isinstance(m.get("fail_reason"), str) else ""
        reason = m.get("recompile_reason")
        if not isinstance(reason, str) or not reason:
            reason = self.reasons.get(f"{frame}/{attempt}") if attempt else None
        compile_ = Compile(
            compile_id=cid, frame=frame, attempt=attempt, function=name, file=file, line=line,
            seconds=_num(m.get("entire_frame_compile_time_s")) or 0.0,
            start=_num(m.get("start_time")),
            recompile=change(reason) if reason and attempt else None,
            fallback=bool(_LIMIT.search(full_fail[:4000])), failed=fail)
        if len(self.log.compiles) < MAX_COMPILES:
            self.log.compiles.append(compile_)
        else:
            self.log.compiles_dropped += 1
        config = m.get("dynamo_config")
        if self.log.recompile_limit is None and isinstance(config, str):
            found = _LIMIT_SET.search(config[:200_000])
            self.log.recompile_limit = int(found.group(1)) if found else None
        restart = m.get("restart_reasons")
        if isinstance(restart, list) and restart and not any(
                b.function == name or root_function(name) == b.function
                for b in self.log.breaks.values()):
            # No dynamo_graph_break_reason artifact (older torch): the restart reason, at
            # the frame's own line.
            for r in restart[:8]:
                if isinstance(r, str) and "graph break" in r.lower():
                    self.break_(clean(r, 200), file, line, name, "")

    def artifact(self, data: dict[str, Any], payload: str | None) -> None:
        name = data["artifact"].get("name")
        frame, attempt = self.ids(data)
        if name == "recompile_reasons" and payload:
            self.reasons[f"{frame}/{attempt}"] = _first_reason(payload)
        elif name == "dynamo_graph_break_reason" and payload:
            self.break_text(payload)
        elif name == "inductor_collective_schedule" and payload:
            try:
                sched = json.loads(payload[:MAX_GRAPHS * 50])
            except ValueError:
                return
            if isinstance(sched, list) and len(self.inductor) < MAX_GRAPHS:
                ops = [_SCHEDULED.search(s) for s in sched[:512] if isinstance(s, str)]
                self.inductor[f"{frame}/{attempt}"] = [
                    m["op"] for m in ops if m and m["op"] != "wait_tensor"]
        elif name == "torch_version" and payload:
            try:
                version = json.loads(payload[:4000]).get("pytorch_version")
            except (ValueError, AttributeError):
                return
            self.log.torch_version = clean(version, 40) or None

    def break_text(self, text: str) -> None:
        lines = text.split("\n")
        m = _BREAK_AT.match(lines[0]) if lines else None
        file, line = (m["file"], int(m["line"])) if m else ("?", None)
        reason = ""
        for i, raw in enumerate(lines[1:40], 1):
            if raw.startswith("Graph Break Reason:"):
                reason = raw.split(":", 1)[1].strip()
                if reason.startswith("Encountered graph break"):
                    reason = next((s.strip() for s in lines[i + 1:i + 8] if s.strip()), reason)
                break
        function, code = "?", ""
        for i, raw in enumerate(lines[:400]):
            fm = _FILE_LINE.match(raw)
            if fm and fm["file"] == file and line is not None and int(fm["line"]) == line:
                function = fm["fn"]
                code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        self.break_(clean(reason, 200) or "graph break", clean(file, 500), line,
                    clean(function, 120), clean(code, 160))

    def break_(self, reason: str, file: str, line: int | None, function: str, code: str) -> None:
        key = (reason, file, line)
        if key not in self.log.breaks and len(self.log.breaks) >= MAX_BREAKS:
            return
        b = self.log.breaks.setdefault(key, Break(reason, file, line, function, code))
        b.count += 1

    def graph(self, data: dict[str, Any], payload: str) -> None:
        frame, attempt = self.ids(data)
        ops = []
        for raw in payload.split("\n"):
            m = _COLLECTIVE.search(raw)
            if m and m["op"] != "wait_tensor":
                args = [a.strip().strip("'\"") for a in m["args"].split(",")]
                red = next((a for a in args[1:2] if a in (
                    "sum", "avg", "max", "min", "product", "premul_sum", "band", "bor", "bxor")),
                    "")
                ops.append(" ".join(p for p in (m["op"], m["shape"] or "", red) if p))
        if ops and len(self.log.schedules) < MAX_GRAPHS:
            self.log.schedules[f"{frame}/{attempt}"] = ops

    def finish(self) -> None:
        for cid, ops in self.inductor.items():
            self.log.schedules.setdefault(cid, ops)


def _first_reason(payload: str) -> str:
    """The most recent failed guard of a recompile_reasons payload (a JSON list, or the text
    of one reason)."""
    try:
        value = json.loads(payload[:MAX_GRAPHS * 20])
    except ValueError:
        return payload.split("\n", 1)[0][:400]
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value[0][:400]
    return value[:400] if isinstance(value, str) else ""


def parse_log(path: str) -> RankLog:
    """Read one rank's log (raises CompileLogError when it cannot be opened or read)."""
    log = RankLog(path=path, rank=None, stats=ReadStats())
    builder = _Builder(log)
    for rec in records(path, _wants, log.stats):
        builder.add(rec)
    builder.finish()
    if log.rank is None:
        log.rank = rank_of(path)
    return log
