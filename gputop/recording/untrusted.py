"""A recording's files are untrusted: whoever could write the directory chose them.

Every file is opened without blocking (``O_NONBLOCK``: a FIFO does not wait for a writer) and
kept only if ``fstat`` says it is a regular file no larger than its bound; then it is read from
that descriptor, so what was checked is what is read. A Parquet part's footer is checked before
any data is decoded: its row groups, rows and the decoded size of every column chunk (which
bounds the longest string) must fit the bounds below. JSON is checked for nesting before it is
parsed (a parser recurses).

The bounds, and what they cost at most (what ``docs/untrusted-input.md`` states):

* ``_meta.json`` and a baseline metrics file: ``MAX_JSON_BYTES`` (1 MiB), ``MAX_JSON_DEPTH``
  (64) levels;
* a part: ``MAX_PART_BYTES`` (256 MiB) on disk, ``MAX_ROW_GROUPS`` row groups,
  ``MAX_PART_ROWS`` rows, ``MAX_CHUNK_BYTES`` (64 MiB) decoded per column chunk and
  ``MAX_PART_DECODED`` (256 MiB) per part: a part gputop writes holds one flush (30 s) of
  samples, a few hundred rows and kilobytes;
* a table read whole (``report``): ``MAX_TABLE_ROWS`` rows (the first parts; the rest are named
  as skipped). A replay holds one part at a time.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gputop.core.format import safe_text
from gputop.core.validate import json_depth

MAX_JSON_BYTES = 1 << 20
MAX_JSON_DEPTH = 64
MAX_PART_BYTES = 256 << 20
MAX_ROW_GROUPS = 1024
MAX_PART_ROWS = 200_000
MAX_CHUNK_BYTES = 64 << 20
MAX_PART_DECODED = 256 << 20
MAX_TABLE_ROWS = 400_000


class UntrustedFile(Exception):
    """A file refused or unreadable: why, in a few words (never its content)."""


def open_regular(path: Path, limit: int) -> int:
    """A descriptor of ``path`` if it is a regular file of at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UntrustedFile("missing") from None
    except OSError as exc:
        raise UntrustedFile(f"cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFile("not a regular file (a FIFO, device, socket or directory)")
        if st.st_size > limit:
            raise UntrustedFile(f"larger than {_size(limit)} ({_size(st.st_size)})")
        # Reading goes on from here: the descriptor must block like any file's.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path, limit: int) -> bytes:
    fd = open_regular(path, limit)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UntrustedFile(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > limit:  # it grew while read
        raise UntrustedFile(f"larger than {_size(limit)}")
    return b"".join(chunks)


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    data = read_bytes(path, limit)
    if not data.strip():
        raise UntrustedFile("empty" if not data else "only white space")
    if not json_depth(data, MAX_JSON_DEPTH):
        raise UntrustedFile(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UntrustedFile(f"not JSON ({library_message(exc, 120)})") from None


def read_parquet(path: Path) -> pa.Table:
    """A part checked from its footer, then read (``UntrustedFile`` when refused)."""
    fd = open_regular(path, MAX_PART_BYTES)
    with os.fdopen(fd, "rb") as f:
        try:
            meta = pq.ParquetFile(f).metadata
            _check_footer(meta)
            f.seek(0)
            return pq.ParquetFile(f).read()
        except UntrustedFile:
            raise
        except pa.ArrowException:
            raise UntrustedFile("not a complete Parquet file") from None
        except MemoryError:
            raise UntrustedFile("too large to decode") from None
        except (OSError, ValueError) as exc:
            raise UntrustedFile(library_message(exc)) from None


def library_message(exc: BaseException, limit: int = 160) -> str:
    """What a library said of an untrusted file, as one escaped line: its message can quote the
    file's bytes (pyarrow's thrift reader names a bad type byte raw, 0x00-0x0f)."""
    return safe_text(" ".join(str(exc).split())[:limit])


def _check_footer(meta: pq.FileMetaData) -> None:
    if meta.num_row_groups > MAX_ROW_GROUPS:
        raise UntrustedFile(f"{meta.num_row_groups} row groups (at most {MAX_ROW_GROUPS})")
    if meta.num_rows > MAX_PART_ROWS or meta.num_rows < 0:
        raise UntrustedFile(f"{meta.num_rows} rows (a part holds at most {MAX_PART_ROWS})")
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            size = group.column(c).total_uncompressed_size
            if size > MAX_CHUNK_BYTES or size < 0:
                raise UntrustedFile(f"column {group.column(c).path_in_schema} decodes to "
                                    f"{_size(size)} (at most {_size(MAX_CHUNK_BYTES)})")
            total += size
    if total > MAX_PART_DECODED:
        raise UntrustedFile(f"decodes to {_size(total)} (at most {_size(MAX_PART_DECODED)})")


def part_rows(path: Path) -> int | None:
    """The rows a part says it holds (its footer only), or None when it is refused."""
    try:
        fd = open_regular(path, MAX_PART_BYTES)
    except UntrustedFile:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            meta = pq.ParquetFile(f).metadata
            _check_footer(meta)
            return meta.num_rows
        except (UntrustedFile, pa.ArrowException, OSError, ValueError, MemoryError):
            return None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
