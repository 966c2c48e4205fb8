"""Flight Recorder dumps among files and folders, told apart from profiler traces by content.

A folder holds dumps when one of its files starts like one (``dumps.sniff``): a pickle, or a
JSON object with the Flight Recorder's keys. Then every file in it whose name ends in a rank
number is read as a dump too (a damaged one must get its own error, not be skipped).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from gputop.diagnostics.hang.dumps import (
    MAX_DUMP_BYTES,
    DumpError,
    FrDump,
    rank_from_name,
    read_dump,
    sniff,
)

HEAD_BYTES = 4096  # read of each file to tell a dump from a trace
MAX_FILES = 65536  # files looked at in one folder


def _head(path: str) -> bytes:
    try:  # a FIFO is never opened here: opening one would take a writer's data away
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, HEAD_BYTES)
    except OSError:
        return b""
    finally:
        os.close(fd)


def is_dump_file(path: str) -> bool:
    """A regular file whose first bytes look like a Flight Recorder dump."""
    return sniff(_head(path)) is not None


def dump_files(folder: str) -> list[str]:
    """The dumps in ``folder`` (not recursive), or [] when none of its files is one."""
    try:
        names = sorted(e.name for e in os.scandir(folder)
                       if not e.name.startswith(".") and e.is_file())[:MAX_FILES]
    except OSError:
        return []
    paths = [os.path.join(folder, n) for n in names]
    sniffed = [p for p in paths if is_dump_file(p)]
    if not sniffed:
        return []
    ranked = [p for p in paths if rank_from_name(p) is not None and not p.endswith(
        (".pt.trace.json", ".pt.trace.json.gz", ".gz", ".tmp"))]
    return sorted(set(sniffed) | set(ranked))


@dataclass
class LoadedDumps:
    dumps: dict[int, FrDump] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # one line each
    notes: list[str] = field(default_factory=list)


def load_dumps(paths: Iterable[str], max_bytes: int = MAX_DUMP_BYTES) -> LoadedDumps:
    """Read each dump; key them by rank. A rank given twice (a pickle and its JSON twin) keeps
    the pickle, which has the stacks; a dump with no rank is an error."""
    out = LoadedDumps()
    for path in paths:
        try:
            d = read_dump(path, max_bytes=max_bytes)
        except DumpError as exc:
            out.errors.append(str(exc))
            continue
        if d.rank is None:
            out.errors.append(f"{path}: cannot tell its rank: name the file with the rank at the "
                              "end (as PyTorch does: TORCH_FR_DUMP_TEMP_FILE + rank)")
            continue
        prev = out.dumps.get(d.rank)
        if prev is not None:
            keep, drop = (prev, d) if prev.form == "pickle" or d.form != "pickle" else (d, prev)
            out.dumps[d.rank] = keep
            out.notes.append(f"rank {d.rank}: two dumps ({keep.name}, {drop.name}): read "
                             f"{keep.name}")
            continue
        out.dumps[d.rank] = d
    return out
