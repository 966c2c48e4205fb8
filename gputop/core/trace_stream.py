"""Read a Chrome trace of any size in bounded memory: the ``traceEvents`` array in batches of
whole events, and the rest of the document apart.

Standard library only: the agent uses it inside the training process (whose Python may lack
gputop's dependencies) to cut an over-budget trace, and ``loading/load.py`` to read traces larger
than it decodes whole.

``GzipReader`` inflates every gzip member of a file piece by piece. ``EventSplitter`` cuts the
bytes between ``"traceEvents": [`` and its ``]`` into runs of whole events: a run ends at a
``}`` followed by ``,`` or ``]``, and the caller's decoder, given ``[run]``, is the proof that
the cut is right. A cut inside an event (a nested object, or a ``},{`` in a string) leaves a
bracket or a string open, which no JSON decoder accepts; the splitter then tries the previous
candidate, then a longer window. What stays in memory is one window, never the file.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

WINDOW = 16 << 20  # bytes of events decoded in one batch
MAX_WINDOW = 64 << 20  # a run of events without an acceptable cut in this much: not a trace
MAX_HEADER = 64 << 20  # the document around the events (deviceProperties, ...)
READ = 1 << 20
_TRIES = 4  # candidate cuts tried, last first, before the window grows

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT = re.compile(rb"\}\s*(?=[,\]])")
_SPACE = b" \t\r\n"


class StreamError(ValueError):
    """The bytes are not a Chrome trace; ``kind``: "truncated", "invalid", "empty",
    "oversized" or "gzip". The message is one line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class GzipReader:
    """``read(n)`` of the decompressed bytes of every gzip member of ``fh`` (``first``: bytes
    already read from it). Trailing bytes that are not another member are ignored, as gzip
    does; a file that ends inside a member raises StreamError("gzip")."""

    def __init__(self, fh: BinaryIO, first: bytes = b"") -> None:
        self._fh, self._pending = fh, first
        self._inflate = zlib.decompressobj(wbits=31)
        self._done = False

    def read(self, n: int) -> bytes:
        while not self._done:
            chunk = self._pending or self._inflate.unconsumed_tail or self._fh.read(READ)
            self._pending = b""
            if not chunk:
                if self._inflate.eof:
                    self._done = True
                    break
                raise StreamError("gzip", "truncated or corrupt gzip data")
            try:
                # Bounded output per call, in pieces of at most 4 MiB: zlib grows its output
                # buffer by doubling, so one large call would briefly hold twice its output.
                out = self._inflate.decompress(chunk, min(max(n, READ), 4 * READ))
            except zlib.error:
                raise StreamError("gzip", "truncated or corrupt gzip data") from None
            if self._inflate.eof:
                rest = self._inflate.unused_data
                self._inflate = zlib.decompressobj(wbits=31)
                if not rest:
                    rest = self._fh.read(READ)
                if rest[:2] == b"\x1f\x8b":
                    self._pending = rest
                else:  # no further member: what follows is ignored
                    self._done = True
            if out:
                return out
        return b""


class EventSplitter:
    """Iterate over ``decode(b"[" + run + b"]")`` for consecutive runs of whole events of the
    trace that ``read(n)`` returns piece by piece (``b""`` at the end). ``decode`` must raise
    ValueError when its input is not valid JSON (and only then). Once iteration ends,
    ``header`` holds the document with an empty event array, for the caller to decode
    (``b"[]"`` for the bare-array form), and ``events_bytes`` how many bytes the events took.
    """

    def __init__(self, read: Callable[[int], bytes], decode: Callable[[bytes], Any],
                 first: bytes = b"", window: int = WINDOW, max_window: int = MAX_WINDOW) -> None:
        self._read, self._decode = read, decode
        self._buf, self._eof = first, False
        self._skipped_any = False  # white space seen before the document (see _start)
        self.window, self.max_window = window, max_window
        self.header: bytes | None = None
        self.events_bytes = 0

    def _fill(self, size: int) -> None:
        parts = [self._buf]
        have = len(self._buf)
        while have < size and not self._eof:
            chunk = self._read(max(READ, size - have))
            if not chunk:
                self._eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        self._buf = b"".join(parts)

    def _skip(self, separators: bytes = _SPACE) -> None:
        """Drop leading whitespace (and one comma) from the buffer, reading on as needed."""
        comma = False
        while True:
            stripped = self._buf.lstrip(_SPACE)
            if len(stripped) != len(self._buf):
                self._skipped_any = True
            if not comma and stripped[:1] == b",":
                stripped, comma = stripped[1:].lstrip(_SPACE), True
            self._buf = stripped
            if stripped or self._eof:
                return
            self._fill(READ)

    def _start(self) -> bytes:
        """The document up to and with the ``[`` that opens the events."""
        self._skip()
        self._fill(READ)
        if not self._buf.strip():
            # Whitespace was skipped on the way: say whether there was any (1 GiB of spaces
            # is not an empty file).
            what = "only white space" if self._skipped_any else "empty file"
            raise StreamError("empty", f"{what}, not a trace")
        if self._buf[:1] == b"[":
            self._buf = self._buf[1:]
            return b"["
        if self._buf[:1] != b"{":
            raise StreamError("invalid", "not valid JSON (a trace starts with { or [)")
        while True:
            found = _EVENTS_KEY.search(self._buf)
            if found is not None:
                prefix, self._buf = self._buf[:found.end()], self._buf[found.end():]
                return prefix
            if self._eof:
                raise StreamError("no-events", "not a Chrome trace (no traceEvents)")
            if len(self._buf) > MAX_HEADER:
                raise StreamError("oversized", f"no traceEvents in the first {MAX_HEADER >> 20} "
                                  "MB: not a Chrome trace")
            self._fill(len(self._buf) + READ)

    def __iter__(self) -> Iterator[Any]:
        prefix = self._start()
        window = self.window
        while True:
            self._skip()
            self._fill(window)
            if self._buf[:1] == b"]" or (not self._buf and self._eof):
                self._tail(prefix)
                return
            limit = len(self._buf) if self._eof else min(len(self._buf), window)
            ends = [m.start() + 1 for m in _CUT.finditer(self._buf, max(0, limit - (1 << 20)),
                                                          limit)]
            if self._eof:  # the bare-array form may end without its "]"
                last = self._buf.rstrip(_SPACE + b",")
                if last.endswith(b"}"):
                    ends.append(len(last))
            for end in reversed(ends[-_TRIES:]):
                run = self._buf[:end]
                try:
                    out = self._decode(b"[" + run + b"]")
                except ValueError:
                    continue
                self.events_bytes += len(run)
                self._buf = self._buf[end:]
                window = self.window
                yield out
                break
            else:
                if self._eof:
                    self._fail(self._buf)
                if window >= self.max_window:
                    self._fail(self._buf[:limit], oversized=True)
                window = min(self.max_window, window * 2)

    def _tail(self, prefix: bytes) -> None:
        """The rest of the document after the events (``]`` and the keys that follow)."""
        while not self._eof and len(self._buf) <= MAX_HEADER:
            self._fill(len(self._buf) + READ)
        if len(self._buf) > MAX_HEADER:
            raise StreamError("oversized", f"more than {MAX_HEADER >> 20} MB after the events: "
                              "not a Chrome trace")
        if prefix == b"[":  # the array form: the closing bracket is optional
            self.header = b"[]"
            return
        if not self._buf:
            raise StreamError("truncated", "truncated JSON (the trace file is incomplete)")
        self.header = prefix + self._buf

    def _fail(self, data: bytes, oversized: bool = False) -> None:
        """No cut of ``data`` decodes: say why in the decoder's words."""
        try:
            self._decode(b"[" + data)
        except ValueError as exc:
            text = str(exc)
            if "truncated" not in text:
                raise StreamError("invalid", f"not valid JSON ({text})") from None
        if oversized:
            raise StreamError("oversized", f"no whole event in {self.max_window >> 20} MB of "
                              "the event array: not a trace, or a damaged one")
        raise StreamError("truncated", "truncated JSON (the trace file is incomplete)")
