"""Flight Recorder dumps read as untrusted input.

PyTorch's Flight Recorder (``TORCH_FR_BUFFER_SIZE``) keeps each rank's last collectives in a
ring buffer; ``torch._C._distributed_c10d._dump_fr_trace()`` returns it as a pickle (written
to ``TORCH_FR_DUMP_TEMP_FILE`` + rank on an NCCL timeout) and ``_dump_fr_trace_json()`` as
JSON. A dump may come from another user: reading it must not run code when root reads it.

* The pickle is read by an unpickler that builds only dict, list, tuple, set, str, bytes, int,
  float, bool and None: ``find_class`` (every class, function and extension code goes through
  it) and ``persistent_load`` raise, so no reduce, no object, no import.
* Its size is bounded before it is read (``MAX_DUMP_BYTES``, 256 MiB by default: a buffer of
  20 000 entries with stacks is a few tens of MB). A pickle over ``FAST_PICKLE_BYTES`` is read
  through a reader that counts what the unpickler builds as it reads: it stops at
  ``MAX_OBJECTS`` objects, so a file of empty dicts (each byte one object, ~90 bytes of
  memory) cannot take gigabytes; ``MAX_ENTRIES`` is applied to what that leaves.
* Every field is type-checked and clipped; anything else gives ``DumpError`` with one line.

Pure: no torch, no textual.
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from gputop.diagnostics.hang.stacks import MAX_FRAMES, StackFrame

MAX_DUMP_BYTES = 256 * 1024 * 1024  # refuse a dump larger than this, before reading it
MAX_ENTRIES = 200_000  # entries kept of one dump (a ring buffer is a few thousand)
MAX_FIELD = 512  # characters of a name, path or description
MAX_PGS = 4096  # process groups described in one dump
MAX_DIMS = 16  # tensor sizes kept per entry (list of shapes), each of at most MAX_DIMS dims
# Below this size the C unpickler reads a pickle (at most ~90 bytes of memory per byte: a few
# hundred MB); above it the counting one does, bounded by objects built, not bytes.
FAST_PICKLE_BYTES = 4 * 1024 * 1024
MAX_OBJECTS = 6_000_000  # reads of one pickle (~an object each): ~35 000 entries with stacks

# A rank number at the end of a file name (PyTorch writes TORCH_FR_DUMP_TEMP_FILE + rank,
# e.g. "nccl_trace_rank_3"); an extension such as ".json" or ".pkl" is allowed after it.
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|bin))?$")
_COMPLETED_STATES = frozenset({"completed"})


class DumpError(Exception):
    """A dump that cannot be read: the message is one line that names the file."""


@dataclass(frozen=True)
class FrEntry:
    """One Flight Recorder record: a collective (or p2p op) as one rank issued it."""

    pg_id: str  # the process group's name as the dump keys it ("0", or a hash for NCCL)
    pg_desc: str  # its description ("default_pg", "DATA_PARALLEL_GROUP", "undefined")
    seq: int  # collective_seq_id (p2p_seq_id for p2p ops)
    op: str  # profiling_name: "nccl:all_reduce", "gloo:all_gather", ...
    state: str  # "scheduled", "started", "completed"
    retired: bool  # PyTorch retired the work (it finished, gloo's way of saying completed)
    is_p2p: bool = False
    pg_index: int | None = None  # the rank's local pg_id: what pg_status is keyed by
    record_id: int | None = None
    time_created_ns: int | None = None
    time_started_ns: int | None = None
    time_completed_ns: int | None = None
    input_sizes: tuple = ()
    input_dtypes: tuple = ()
    output_sizes: tuple = ()
    output_dtypes: tuple = ()
    timeout_ms: int | None = None
    frames: tuple[StackFrame, ...] = ()

    @property
    def completed(self) -> bool:
        return self.state in _COMPLETED_STATES or self.retired

    def call(self) -> str:
        """The call as a line: ``nccl:all_reduce in [[1024]] Float``."""
        sizes = json.dumps(list(self.input_sizes), separators=(",", ":"))
        dtypes = ",".join(self.input_dtypes)
        return f"{self.op} {sizes} {dtypes}".rstrip()


@dataclass(frozen=True)
class FrDump:
    """One rank's dump. ``rank`` comes from the file name's trailing number, else from the
    dump's own process-group information; ``dumped_at`` is the file's modification time
    (epoch seconds, None for bytes), the moment "waited for N s" is measured to."""

    name: str
    rank: int | None
    version: str
    entries: tuple[FrEntry, ...]
    # pg name -> {"desc", "ranks": [int] or None}: as the dump states it (gloo leaves it
    # mostly empty; NCCL lists every group's global ranks).
    pg_config: dict[str, dict] = field(default_factory=dict)
    # The rank's local pg_id (as str; the entries' ``pg_index``) -> {"enqueued", "started",
    # "completed"}: the last collective seq of each (ints, -1 = none).
    pg_status: dict[str, dict[str, int]] = field(default_factory=dict)
    comm_lib_version: str = ""
    form: str = "pickle"  # "pickle" or "json"
    dumped_at: float | None = None
    truncated_entries: int = 0  # entries past MAX_ENTRIES, dropped


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain containers, numbers and strings only. Every GLOBAL/STACK_GLOBAL/INST/OBJ and
    extension code resolves through find_class, so REDUCE/NEWOBJ/BUILD never get a callable."""

    def find_class(self, module: str, name: str):  # noqa: ANN201 - refuses every name
        raise pickle.UnpicklingError(
            f"refers to {_clip(str(module), 60)}.{_clip(str(name), 60)} (a class or function: "
            "refused, a Flight Recorder dump holds plain data only)")

    def persistent_load(self, pid):  # noqa: ANN001, ANN201
        raise pickle.UnpicklingError("uses a persistent id (refused)")


class _CountingReader:
    """The file the C unpickler reads a large pickle from. With no ``peek`` it asks for each
    opcode's bytes in turn, so the calls count the objects it builds; a FRAME (whose body it
    takes in one read, then runs without asking) is charged a byte an object. Past
    ``budget`` it raises, before the memory is spent."""

    def __init__(self, data: bytes, budget: int) -> None:
        self._file = io.BytesIO(data)
        self._left = budget
        self._budget = budget
        self._frame = 0  # 1: a FRAME opcode was read, 2: its length too: the body comes next
        self.refused: str | None = None  # the C unpickler reports a read's error as an EOF

    def _charge(self, cost: int) -> None:
        self._left -= cost
        if self._left < 0:
            self.refused = (f"more than {self._budget} objects: over the object bound, refused "
                            "(a Flight Recorder ring holds a few thousand entries)")
            raise pickle.UnpicklingError(self.refused)

    def read(self, n: int = -1) -> bytes:
        data = self._file.read(n)
        if self._frame == 2:
            self._charge(len(data))
            self._frame = 0
        else:
            self._charge(1)
            self._frame = 1 if data == pickle.FRAME else (
                2 if self._frame == 1 and len(data) == 8 else 0)
        return data

    def readline(self) -> bytes:
        self._charge(1)
        self._frame = 0
        return self._file.readline()

    def readinto(self, buf) -> int:  # noqa: ANN001 - a writable buffer
        self._charge(1)
        self._frame = 0
        return self._file.readinto(buf)


def _unpickle(data: bytes) -> object:
    if len(data) <= FAST_PICKLE_BYTES:
        return _PlainUnpickler(io.BytesIO(data)).load()
    reader = _CountingReader(data, MAX_OBJECTS)
    try:
        return _PlainUnpickler(reader).load()
    except (EOFError, pickle.UnpicklingError):
        if reader.refused:
            raise pickle.UnpicklingError(reader.refused) from None
        raise


def _clip(text: str, limit: int = MAX_FIELD) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def rank_from_name(name: str) -> int | None:
    """The trailing number of a dump's file name (``nccl_trace_rank_3`` -> 3)."""
    m = _RANK_IN_NAME.search(os.path.basename(name))
    if not m or len(m.group(1)) > 7:
        return None
    return int(m.group(1))


def read_dump(path: str, max_bytes: int = MAX_DUMP_BYTES) -> FrDump:
    """Read one dump file (pickle or JSON, told apart by content). Raises ``DumpError``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise DumpError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DumpError(f"{path}: not a regular file (a FIFO, device or folder): refused")
        if st.st_size > max_bytes:
            raise DumpError(f"{path}: {st.st_size / 2**20:.0f} MiB is over the dump size bound "
                            f"({max_bytes / 2**20:.0f} MiB): refused unread")
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            data = fh.read(max_bytes + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:  # it grew while we read it
        raise DumpError(f"{path}: over the dump size bound ({max_bytes / 2**20:.0f} MiB): refused")
    dump = read_dump_bytes(data, path, max_bytes=max_bytes)
    return _with(dump, dumped_at=st.st_mtime)


def _with(dump: FrDump, **changes: Any) -> FrDump:
    from dataclasses import replace

    return replace(dump, **changes)


def sniff(head: bytes) -> str | None:
    """"pickle" or "json" when ``head`` (the first few KiB of a file) looks like a Flight
    Recorder dump, else None. A pickle starts with PROTO (protocol 2 to 5); the JSON form is an
    object whose keys include "pg_config" or "pg_status" (a profiler trace has
    "traceEvents")."""
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        # Any pickle: a profiler trace never is one, and a hostile one must reach the safe
        # reader (and its one-line refusal), not be passed over.
        return "pickle"
    text = head.lstrip()
    if text[:1] == b"{":
        if b'"traceEvents"' in head:
            return None
        if b'"pg_config"' in head or b'"pg_status"' in head or (
                b'"entries"' in head and b'"profiling_name"' in head):
            return "json"
    return None


def read_dump_bytes(data: bytes, name: str, max_bytes: int = MAX_DUMP_BYTES) -> FrDump:
    """A dump from bytes (the agent's reply, a file's content). ``name`` names it in errors
    and gives its rank when it ends in a number. Raises ``DumpError``."""
    if len(data) > max_bytes:
        raise DumpError(f"{name}: {len(data) / 2**20:.0f} MiB is over the dump size bound "
                        f"({max_bytes / 2**20:.0f} MiB): refused")
    if not data:
        raise DumpError(f"{name}: empty file: not a Flight Recorder dump")
    form = "json" if data.lstrip()[:1] == b"{" else "pickle"
    try:
        if form == "pickle":
            raw = _unpickle(data)
        else:
            raw = json.loads(data)
    except RecursionError:
        raise DumpError(f"{name}: nested too deeply: not a Flight Recorder dump") from None
    except MemoryError:
        raise DumpError(f"{name}: not enough memory to read it") from None
    except (pickle.UnpicklingError, EOFError) as exc:
        msg = _one_line(exc) or "truncated"
        if isinstance(exc, EOFError) or "truncated" in msg or "ran out of input" in msg.lower():
            raise DumpError(f"{name}: truncated or damaged pickle ({_clip(msg, 120)})") from None
        raise DumpError(f"{name}: {_clip(msg, 200)}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise DumpError(f"{name}: not a readable {form} dump ({_clip(_one_line(exc), 120)})") \
            from None
    except Exception as exc:  # any other malformed opcode stream: still one line
        raise DumpError(f"{name}: damaged {form} dump ({type(exc).__name__}: "
                        f"{_clip(_one_line(exc), 120)})") from None
    return _parse(raw, name, form)


# -- the dump's shape, checked field by field --------------------------------------------------

def _str(value: object, default: str = "") -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return _clip(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return default


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 1 << 63 else None
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        return int(value)
    return None


def _sizes(value: object) -> tuple:
    if not isinstance(value, (list, tuple)):
        return ()
    out = []
    for shape in value[:MAX_DIMS]:
        if isinstance(shape, (list, tuple)):
            out.append(tuple(v for v in (_int(x) for x in shape[:MAX_DIMS]) if v is not None))
        elif (v := _int(shape)) is not None:
            out.append((v,))
    return tuple(out)


def _dtypes(value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(_clip(_str(v), 32) for v in value[:MAX_DIMS])


@functools.lru_cache(maxsize=65536, typed=True)
def _frame(name: object, filename: object, line: object) -> StackFrame:
    # A buffer repeats a few call sites thousands of times: each is checked and built once.
    return StackFrame(function=_str(name, "?"), file=_str(filename), line=_int(line))


def _frames(value: object, memo: dict[int, Any]) -> tuple[StackFrame, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    # A pickle may name one list from every entry for the price of a reference: each distinct
    # object is read once, so the work stays proportional to the file's size.
    key = id(value)
    if key in memo:
        return memo[key]
    memo[key] = result = _frames_of(value)
    return result


def _frames_of(value: list | tuple) -> tuple[StackFrame, ...]:
    out = []
    for f in value[:MAX_FRAMES]:
        if isinstance(f, dict):
            name, filename, line = f.get("name"), f.get("filename"), f.get("line")
            try:
                out.append(_frame(name, filename, line))
            except TypeError:  # an unhashable field: not a frame PyTorch writes
                out.append(StackFrame(function=_str(name, "?"), file=_str(filename),
                                      line=_int(line)))
    return tuple(out)


def _time(value: object) -> int | None:
    v = _int(value)
    return v if v else None  # the JSON form writes 0 for "not seen"


def _entry(raw: object, memo: dict[int, Any]) -> FrEntry | None:
    if not isinstance(raw, dict):
        return None
    key = id(raw)
    if key not in memo:
        memo[key] = _entry_of(raw, memo)
    return memo[key]


def _entry_of(raw: dict, memo: dict[int, Any]) -> FrEntry | None:
    pg = raw.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) >= 2:
        pg_id, pg_desc = _str(pg[0]), _str(pg[1])
    else:
        pg_id, pg_desc = _str(raw.get("pg_id")), ""
    is_p2p = raw.get("is_p2p") is True
    seq = _int(raw.get("p2p_seq_id") if is_p2p else raw.get("collective_seq_id"))
    if seq is None:
        seq = _int(raw.get("seq_id"))  # dumps before 2.5 had one counter
    op = _str(raw.get("profiling_name"))
    if seq is None or not op:
        return None
    return FrEntry(
        pg_id=pg_id, pg_desc=pg_desc, seq=seq, op=op, is_p2p=is_p2p,
        pg_index=_int(raw.get("pg_id")),
        state=_str(raw.get("state"), "unknown"), retired=raw.get("retired") is True,
        record_id=_int(raw.get("record_id")),
        time_created_ns=_time(raw.get("time_created_ns")),
        time_started_ns=_time(raw.get("time_discovered_started_ns")),
        time_completed_ns=_time(raw.get("time_discovered_completed_ns")),
        input_sizes=_sizes(raw.get("input_sizes")), input_dtypes=_dtypes(raw.get("input_dtypes")),
        output_sizes=_sizes(raw.get("output_sizes")),
        output_dtypes=_dtypes(raw.get("output_dtypes")),
        timeout_ms=_int(raw.get("timeout_ms")), frames=_frames(raw.get("frames"), memo))


MAX_RANKS = 1 << 17  # ranks listed for one group
MAX_RANKS_TOTAL = 1 << 20  # ranks listed over all groups of one dump (a pickle can name one
# long list from every group for the price of a reference: the work stays bounded)


def _ranks(value: object) -> list[int] | None:
    """pg_config's "ranks": a string "[0, 1, 2]" (as PyTorch writes it) or a list."""
    if isinstance(value, str):
        if len(value) > 8 * MAX_RANKS:
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, (list, tuple)) or len(value) > MAX_RANKS:
        return None
    if all(type(x) is int for x in value):  # the usual case, fast
        out = [x for x in value if 0 <= x < 1 << 31]
    else:
        out = [v for v in (_int(x) for x in value) if v is not None and v >= 0]
    return out or None


def _parse(raw: object, name: str, form: str) -> FrDump:
    if not isinstance(raw, dict):
        raise DumpError(f"{name}: not a Flight Recorder dump (a {type(raw).__name__}, not a "
                        "dict with 'entries')")
    entries_raw = raw.get("entries", [])
    if "entries" not in raw and "pg_config" not in raw and "pg_status" not in raw:
        raise DumpError(f"{name}: not a Flight Recorder dump (no 'entries', 'pg_config' or "
                        "'pg_status')")
    if not isinstance(entries_raw, (list, tuple)):
        raise DumpError(f"{name}: damaged dump ('entries' is a {type(entries_raw).__name__})")
    dropped = max(0, len(entries_raw) - MAX_ENTRIES)
    memo: dict[int, Any] = {}  # id -> parsed, for objects the pickle shares (raw keeps them)
    entries = tuple(e for e in (_entry(r, memo) for r in entries_raw[-MAX_ENTRIES:])
                    if e is not None)
    if entries_raw and not entries:
        raise DumpError(f"{name}: damaged dump (none of its {len(entries_raw)} entries names a "
                        "collective and a sequence number)")
    pg_config: dict[str, dict] = {}
    cfg = raw.get("pg_config")
    if isinstance(cfg, dict):
        budget = MAX_RANKS_TOTAL
        for key, val in list(cfg.items())[:MAX_PGS]:
            if isinstance(val, dict):  # gloo keys its one entry by ""
                ranks = _ranks(val.get("ranks")) if budget > 0 else None
                budget -= len(ranks or ()) + 1
                pg_config[_str(key)] = {"desc": _str(val.get("desc")), "ranks": ranks}
    pg_status: dict[str, dict[str, int]] = {}
    sts = raw.get("pg_status")
    if isinstance(sts, dict):
        for key, val in list(sts.items())[:MAX_PGS]:
            if isinstance(val, dict):
                status: dict[str, int] = {}
                for k in ("enqueued", "started", "completed"):
                    v = _int(val.get(f"last_{k}_collective"))
                    status[k] = -1 if v is None else v
                pg_status[_str(key)] = status
    rank = rank_from_name(name)
    if rank is None:
        rank = _rank_from_content(raw, pg_config)
    return FrDump(name=name, rank=rank, version=_str(raw.get("version")), entries=entries,
                  pg_config=pg_config, pg_status=pg_status,
                  comm_lib_version=_str(raw.get("comm_lib_version")), form=form,
                  truncated_entries=dropped)


def _rank_from_content(raw: dict, pg_config: dict[str, dict]) -> int | None:
    """A rank stated by the dump itself: a "rank" key (some writers add it); else the one rank
    common to every group it lists (NCCL lists the global ranks of each group the rank is in:
    its tensor- and data-parallel groups meet in that rank alone); else none."""
    for key in ("rank", "global_rank"):
        v = _int(raw.get(key))
        if v is not None and v >= 0:
            return v
    common: set[int] | None = None
    for cfg in pg_config.values():
        if cfg.get("ranks"):
            common = set(cfg["ranks"]) if common is None else common & set(cfg["ranks"])
    return next(iter(common)) if common is not None and len(common) == 1 else None
