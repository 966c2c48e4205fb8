"""Cut an exported trace to its size budget before it is written (``write_trace``).

The profiler's export is read twice, in batches of whole events (``trace_stream``), never
whole: the first pass measures the bytes of each tier of ``trace_cut`` by duration, the second
writes, gzipped, the events that fit the budget (tiers in order, longest first) and a
top-level ``"gputop": {"cut": [...]}`` saying what was cut, which ``gputop analyze`` reports.

It runs in a child process of the training process (``python -E``: no PYTHONPATH, so no agent
in it, and gputop's tree put on its path by hand), so the training thread never shares its
interpreter lock with this work; msgspec is used when that Python has it, the json module
otherwise. ``python -m``-style entry: ``main([raw, out, budget_bytes, note])``.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from gputop.core import trace_cut as trace_cut
from gputop.core.trace_stream import EventSplitter

Row = tuple[bytes, int, float]  # raw event JSON, tier, duration (us)


def _fields(item: Any) -> tuple[int, float]:
    """The tier and duration of a decoded event (any shape: a trace is untrusted)."""
    if not isinstance(item, dict):
        return trace_cut.OTHER, 0.0
    dur = item.get("dur")
    dur = float(dur) if isinstance(dur, (int, float)) and not isinstance(dur, bool) else 0.0
    return trace_cut.tier(str(item.get("ph") or ""), str(item.get("cat") or ""),
                          str(item.get("name") or "")), dur


def _msgspec_decoder() -> Callable[[bytes], list[Row]] | None:
    try:
        import msgspec
    except ImportError:
        return None

    class Lite(msgspec.Struct):
        ph: str = ""
        cat: str = ""
        name: str = ""
        dur: float = 0.0

    raws = msgspec.json.Decoder(list[msgspec.Raw])
    lite = msgspec.json.Decoder(list[Lite])
    loose = msgspec.json.Decoder(list[Any])

    def decode(batch: bytes) -> list[Row]:
        spans = raws.decode(batch)  # raises on invalid JSON: a wrong cut, or a broken file
        try:
            fields = [(trace_cut.tier(e.ph, e.cat, e.name), e.dur) for e in lite.decode(batch)]
        except msgspec.ValidationError:  # an odd field somewhere in the batch
            fields = [_fields(item) for item in loose.decode(batch)]
        return [(bytes(raw), t, dur) for raw, (t, dur) in zip(spans, fields)]

    return decode


def _json_decode(batch: bytes) -> list[Row]:
    out = []
    for item in json.loads(batch):
        t, dur = _fields(item)
        out.append((json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode(), t, dur))
    return out


def _rows(path: str, decode: Callable[[bytes], list[Row]]) -> tuple[EventSplitter, Iterator]:
    fh = open(path, "rb")  # noqa: SIM115 - closed by the caller through the iterator's end
    splitter = EventSplitter(fh.read, decode)

    def rows() -> Iterator[Row]:
        try:
            for batch in splitter:
                yield from batch
        finally:
            fh.close()

    return splitter, rows()


def cut_to_budget(raw: str, out: str, budget: int, why: str) -> list[str]:
    """Write ``raw`` (the profiler's JSON export) to ``out`` gzipped, cut to ``budget`` bytes of
    JSON; returns what was cut, one line each (empty when it fitted)."""
    decode = _msgspec_decoder() or _json_decode
    hists: list[dict[int, float]] = [{} for _ in trace_cut.TIER_NAMES]
    splitter, rows = _rows(raw, decode)
    for event, tier, dur in rows:
        hist = hists[tier]
        b = trace_cut.duration_bin(dur)
        hist[b] = hist.get(b, 0.0) + len(event) + 2  # ",\n"
    header = json.loads(splitter.header or b"[]")
    if not isinstance(header, dict):
        header = {}
    header.pop("traceEvents", None)
    header_bytes = len(json.dumps(header)) + 256
    floors = trace_cut.choose_cut(hists, budget - header_bytes)
    counts = [[0, 0] for _ in trace_cut.TIER_NAMES]
    tmp = out + ".part"
    with open(tmp, "wb") as sink, gzip.GzipFile(filename="", mode="wb", compresslevel=6,
                                                 fileobj=sink, mtime=0) as gz:
        _, rows = _rows(raw, decode)
        gz.write(b'{"traceEvents": [\n')
        first = True
        for event, tier, dur in rows:
            floor = floors[tier]
            if floor is not None and trace_cut.duration_bin(dur) < floor:
                counts[tier][1] += 1
                continue
            counts[tier][0] += 1
            gz.write(event if first else b",\n" + event)
            first = False
        notes = trace_cut.describe_cut([tuple(c) for c in counts], floors, why)
        header["gputop"] = {"cut": notes, "budget_bytes": budget}
        gz.write(b"\n],\n" + json.dumps(header)[1:].encode())
    os.replace(tmp, out)
    return notes


def main(argv: list[str]) -> int:
    raw, out, budget, why = argv
    notes = cut_to_budget(raw, out, int(budget), why)
    sys.stdout.write(json.dumps(notes) + "\n")
    return 0
