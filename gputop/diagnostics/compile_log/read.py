"""Stream a TORCH_TRACE log: glog-prefixed JSON records, each maybe followed by its payload.

torch's structured logger writes one record per line, ``V1201 20:34:48.676000 12832
torch/_dynamo/utils.py:2350] {"dynamo_start": ...}``, and a record carrying ``has_payload`` is
followed by its payload, one tab-indented line per line of text. The log is untrusted: a line
longer than ``MAX_LINE`` is skipped unread (its bytes drained in bounded chunks), broken JSON
is counted and passed over, a payload is kept only when its record asks for it and only up to
``MAX_PAYLOAD`` bytes. Memory never depends on the log's size; its size only costs time.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec

MAX_LINE = 4 << 20  # compilation_metrics lines are ~30 KB (the configs); 4 MiB is generous
MAX_PAYLOAD = 256 << 10  # payload kept for a record that asks for it (a break's traceback)
MAX_PAYLOAD_LINES = 512  # filtered payload lines kept (a graph's collective calls)
SNIFF_BYTES = 64 << 10

# "V1201 20:34:48.676000 12832 torch/_dynamo/utils.py:2350] " (glog: level, date, time, thread
# id, the file that logged; the path is bounded so a hostile line cannot make the match slow).
_GLOG = re.compile(rb"[VIWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]\n]{1,400}\] ")

_decode = msgspec.json.Decoder().decode

# What a record wants of its payload: None (skip it), "text" (up to MAX_PAYLOAD), or "c10d"
# (only the lines that call a functional collective: a graph's code is long, its collectives few).
Wants = Callable[[dict[str, Any]], str | None]


class CompileLogError(Exception):
    """A log that cannot be read at all: one line, the path first."""


@dataclass
class ReadStats:
    lines: int = 0
    records: int = 0
    broken: int = 0  # lines with a glog prefix whose JSON did not decode
    overlong: int = 0  # lines over MAX_LINE, skipped
    other: int = 0  # lines that are neither a record nor a payload (plain log text)
    payload_cut: int = 0  # payloads kept only in part

    def notes(self) -> list[str]:
        out = []
        if self.broken:
            out.append(f"{self.broken} record(s) with broken JSON skipped")
        if self.overlong:
            out.append(f"{self.overlong} line(s) longer than {MAX_LINE >> 20} MiB skipped")
        if self.payload_cut:
            out.append(f"{self.payload_cut} payload(s) kept only in part")
        return out


@dataclass
class Record:
    data: dict[str, Any]
    payload: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _open(path: str) -> IO[bytes]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CompileLogError(f"{path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CompileLogError(f"{path}: not a regular file")
    try:
        f: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed by the caller
        if f.read(2) == b"\x1f\x8b":
            f.close()
            return gzip.open(path, "rb")  # type: ignore[return-value]
        f.seek(0)
        return f
    except OSError as exc:
        raise CompileLogError(f"{path}: {exc.strerror or exc}") from None


def is_compile_log(path: str) -> bool:
    """A TORCH_TRACE log, by content: its first line is a glog prefix and a JSON object."""
    try:
        with _open(path) as f:
            head = f.read(SNIFF_BYTES)
    except (CompileLogError, OSError, EOFError):
        return False
    first = head.split(b"\n", 1)[0]
    m = _GLOG.match(first)
    return m is not None and first[m.end():m.end() + 1] == b"{"


def _lines(f: IO[bytes], stats: ReadStats) -> Iterator[bytes | None]:
    """The log's lines; None for one longer than MAX_LINE (drained in bounded reads)."""
    while True:
        chunk = f.readline(MAX_LINE)
        if not chunk:
            return
        stats.lines += 1
        if len(chunk) < MAX_LINE or chunk.endswith(b"\n"):
            yield chunk
            continue
        while True:
            more = f.readline(MAX_LINE)
            if not more or more.endswith(b"\n"):
                break
        stats.overlong += 1
        yield None


class _Payload:
    def __init__(self, mode: str) -> None:
        self.mode, self.parts, self.size, self.cut = mode, [], 0, False

    def add(self, line: bytes) -> None:
        text = line[1:].rstrip(b"\r\n")
        if self.mode == "c10d":
            if b"_c10d_functional." not in text or text.lstrip().startswith(b"#"):
                return
            if len(self.parts) >= MAX_PAYLOAD_LINES:
                self.cut = True
                return
            text = text[:2000]
        elif self.size + len(text) > MAX_PAYLOAD:
            self.cut = True
            return
        self.parts.append(text)
        self.size += len(text) + 1

    def text(self) -> str:
        return b"\n".join(self.parts).decode("utf-8", "replace")


def records(path: str, wants: Wants, stats: ReadStats) -> Iterator[Record]:
    """Each record of the log, in order, with its payload when ``wants`` asks for it."""
    pending: Record | None = None
    payload: _Payload | None = None
    with _open(path) as f:
        try:
            for line in _lines(f, stats):
                if line is not None and line[:1] == b"\t":
                    if payload is not None:
                        payload.add(line)
                    continue
                if pending is not None:
                    if payload is not None:
                        pending.payload = payload.text()
                        stats.payload_cut += payload.cut
                    yield pending
                    pending = payload = None
                if line is None:
                    continue
                m = _GLOG.match(line)
                if m is None or line[m.end():m.end() + 1] != b"{":
                    stats.other += line.strip() != b""
                    continue
                try:
                    data = _decode(line[m.end():])
                except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                    stats.broken += 1
                    continue
                if not isinstance(data, dict):
                    stats.broken += 1
                    continue
                stats.records += 1
                pending = Record(data, meta={"glog": line[:m.end()].decode("ascii", "replace")})
                mode = wants(data) if "has_payload" in data else None
                payload = _Payload(mode) if mode else None
            if pending is not None:
                if payload is not None:
                    pending.payload = payload.text()
                    stats.payload_cut += payload.cut
                yield pending
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise CompileLogError(f"{path}: cannot read ({exc})") from None
