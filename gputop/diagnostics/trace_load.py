"""Loading torch.profiler / Kineto Chrome traces (``.json`` and ``.json.gz``), every schema seen
in the wild, fast.

msgspec decodes straight into typed Structs that hold only the fields the analysis reads (about
4x faster and a third of the memory of decoding into dicts); each event is then visited once and
filed by kind. Schema variants handled here so the metrics never see them:

- categories of 2021 (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``) and current
  ones (``cpu_op``, ``user_annotation``, ``python_function``, ``cuda_runtime``, ``cuda_driver``,
  ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_sync``);
- integer microsecond and float (nanosecond resolution) timestamps;
- ROCm (``hip*`` runtime names, string streams such as ``"0x0"``);
- Triton kernels launched through the driver API (``cuLaunchKernel``);
- ``deviceProperties`` and the older ``computeProperties`` (``major``/``minor``);
- the Chrome "JSON array" form (a bare list of events).
"""

from __future__ import annotations

import math
import os
import re
import stat
import zlib
from dataclasses import dataclass, field

import msgspec


class TraceError(Exception):
    """The file cannot be analysed; the message is one line, meant for the user."""


@dataclass(frozen=True)
class LoadLimits:
    """Bounds on what one trace may cost, so a hostile or broken file (a gzip bomb, /dev/zero,
    a FIFO) fails in one line instead of taking the machine's memory or hanging.

    The defaults hold every real trace we have seen with room to spare (the largest, an 8-GPU
    vLLM/diffusion capture, is 61 MB of JSON and ~130 000 events) while a refused file costs
    at most ~250 MB of memory; `gputop analyze --max-trace-mb/--max-events` raise them."""

    max_bytes: int = 200_000_000  # JSON after decompression
    max_events: int = 1_000_000
    allow_special: bool = False  # read a FIFO or device (e.g. <(zcat trace.gz)) when asked
    # A trace named by another user's agent (root capturing a user's job): the file must be
    # that user's own, and its last path component is not followed if it is a link.
    owner_uid: int | None = None
    follow_links: bool = True


DEFAULT_LIMITS = LoadLimits()
_CHUNK = 1 << 20


class EventArgs(msgspec.Struct, gc=False):
    correlation: int | str | None = None
    stream: int | str | None = None
    device: int | str | None = None
    bytes: int | float | str | None = None
    total_allocated: int | float | None = msgspec.field(default=None, name="Total Allocated")
    alloc_bytes: int | float | None = msgspec.field(default=None, name="Bytes")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    # python_function frames: their own id and their caller's (the frame tree of with_stack).
    python_id: int | float | str | None = msgspec.field(default=None, name="Python id")
    python_parent_id: int | float | str | None = msgspec.field(default=None, name="Python parent id")
    # cuda_sync "Stream Wait Event" records: the stream whose event the stream waits on.
    wait_on_stream: int | str | None = None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = 0.0
    dur: float = 0.0
    args: EventArgs | None = None


class DeviceProps(msgspec.Struct, gc=False):
    id: int | None = None
    name: str = ""
    totalGlobalMem: int | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None
    major: int | None = None  # 2021 "computeProperties"
    minor: int | None = None


class DistributedInfo(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None


class TraceFile(msgspec.Struct, gc=False):
    traceEvents: list[Event] | None = None
    deviceProperties: list[DeviceProps] | None = None
    computeProperties: list[DeviceProps] | None = None
    distributedInfo: DistributedInfo | None = None


_DECODER = msgspec.json.Decoder(TraceFile | list[Event])
_BARE_NA = re.compile(rb'(?<!")N/A(?!")')

# Category (lower-cased) -> role. 2021 traces use capitalised names (Operator, Runtime, ...).
_ROLE_OF_CATEGORY = {
    "cpu_op": "cpu",
    "operator": "cpu",
    "user_annotation": "cpu",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "gpu_sync",
    # GPU work seen only as ranges: CUPTI range-profiler kernels (counters, no timing) and the
    # device-side copies of record_function ranges; evidence of a GPU, never measured.
    "cuda_profiler_range": "gpu_range",
    "gpu_user_annotation": "gpu_range",
}


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    total_memory: int | None
    compute_major: int | None
    compute_minor: int | None

    @property
    def is_amd(self) -> bool:
        return "AMD" in self.name or "Radeon" in self.name or "Instinct" in self.name


@dataclass
class TraceData:
    """Events of one trace, filed by kind. Times are microseconds (floats) as in the file."""

    path: str
    devices: list[Device] = field(default_factory=list)
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    steps: list[Event] = field(default_factory=list)  # host-side ProfilerStep#N
    cpu_ops: list[Event] = field(default_factory=list)  # operators and user annotations
    python: list[Event] = field(default_factory=list)  # python_function frames
    runtime: list[Event] = field(default_factory=list)  # CUDA/HIP runtime and driver calls
    kernels: list[Event] = field(default_factory=list)
    memcpys: list[Event] = field(default_factory=list)
    memsets: list[Event] = field(default_factory=list)
    gpu_syncs: list[Event] = field(default_factory=list)  # cuda_sync (device-side waits)
    gpu_ranges: list[Event] = field(default_factory=list)  # cuda_profiler_range, gpu annotations
    memory: list[Event] = field(default_factory=list)  # "[memory]" instant events
    profiler_span: tuple[float, float] | None = None  # the "PyTorch Profiler (0)" span
    n_events: int = 0
    dropped_events: int = 0  # negative or non-finite times: skipped


def _too_large(path: str, limits: LoadLimits) -> TraceError:
    return TraceError(f"{path}: larger than {limits.max_bytes / 1e6:g} MB of JSON; if it is a "
                      f"real trace, raise the limit with `gputop analyze --max-trace-mb`")


def _gunzip(path: str, fh, first: bytes, limits: LoadLimits) -> bytes:
    """Decompress every gzip member of ``fh`` (``first`` already read), stopping as soon as
    the output passes ``limits.max_bytes``: a bomb costs the limit, not its expansion."""
    out: list[bytes] = []
    total = 0
    pending = first
    decomp = zlib.decompressobj(wbits=31)
    while True:
        chunk = pending or fh.read(_CHUNK)
        pending = b""
        if not chunk:
            break
        while chunk:
            # Small pieces: zlib grows one output buffer by doubling, so a single call allowed
            # the whole limit would briefly hold twice it.
            try:
                piece = decomp.decompress(chunk, min(_CHUNK * 16, limits.max_bytes + 1 - total))
            except zlib.error:
                raise TraceError(f"{path}: truncated or corrupt gzip data") from None
            total += len(piece)
            out.append(piece)
            if total > limits.max_bytes:
                raise _too_large(path, limits)
            chunk = decomp.unconsumed_tail
        if decomp.eof:  # the next member, if any (gzip allows several in one file)
            pending = decomp.unused_data
            decomp = zlib.decompressobj(wbits=31)
            if not pending:
                pending = fh.read(_CHUNK)
                if not pending:
                    return b"".join(out)
            if pending[:2] != b"\x1f\x8b":
                return b"".join(out)  # trailing garbage after the last member: ignored
    # The file ended inside a member.
    raise TraceError(f"{path}: truncated or corrupt gzip data")


def _read_bytes(path: str, limits: LoadLimits = DEFAULT_LIMITS) -> bytes:
    """The trace's JSON bytes, bounded. Opened without blocking (a FIFO would wait for a writer
    for ever) and checked on the descriptor, so what is checked is what is read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if not limits.follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    if limits.owner_uid is not None:
        # Never even open a device another user's agent names: opening some has effects.
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise TraceError(f"{path}: not a regular file; not read for another user's "
                                 "agent")
        except OSError:
            pass  # the open below says what is wrong
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", -1) and not limits.follow_links:
            raise TraceError(f"{path}: is a symbolic link; not followed for a trace named by "
                             "another user's agent") from None
        if isinstance(exc, FileNotFoundError):
            raise TraceError(f"{path}: no such file") from None
        if isinstance(exc, IsADirectoryError):
            raise TraceError(f"{path}: is a directory, not a trace file") from None
        if isinstance(exc, PermissionError):
            raise TraceError(f"{path}: permission denied") from None
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise TraceError(f"{path}: is a directory, not a trace file")
        if limits.owner_uid is not None and st.st_uid != limits.owner_uid:
            raise TraceError(f"{path}: owned by uid {st.st_uid}, not by the agent's uid "
                             f"{limits.owner_uid}; not read")
        # gzip adds a few bytes per 32 KiB at worst: a file this much larger is over the limit
        # whatever it holds (a 5 GB sparse file is refused without reading it).
        if stat.S_ISREG(mode) and st.st_size > limits.max_bytes * 1.01 + 4096:
            raise _too_large(path, limits)
        if not stat.S_ISREG(mode):
            if not limits.allow_special:
                raise TraceError(f"{path}: not a regular file (a device, FIFO or socket); "
                                 "pass --allow-special-files to read one")
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = -1  # the file object owns it now
            first = fh.read(min(_CHUNK, limits.max_bytes + 1))
            if first[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
                return _gunzip(path, fh, first, limits)
            raw = first + fh.read(max(0, limits.max_bytes + 1 - len(first)))
            if len(raw) > limits.max_bytes:
                raise _too_large(path, limits)
            return raw
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _decode(path: str, raw: bytes) -> TraceFile | list[Event]:
    if not raw.strip():
        raise TraceError(f"{path}: empty file, not a trace")
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError:
        # A field of an unexpected type somewhere: fall back to a tolerant, slower path that
        # keeps every event it can read instead of rejecting the whole trace.
        return _decode_tolerant(path, raw)
    except msgspec.DecodeError as exc:
        if "truncated" in str(exc):
            raise TraceError(f"{path}: truncated JSON (the trace file is incomplete)") from None
        if b"N/A" in raw:
            # Some Kineto versions write a bare N/A for unknown values (the TensorBoard plugin
            # works around it the same way): quote it and try again.
            fixed = _BARE_NA.sub(b'"N/A"', raw)
            if fixed != raw:
                return _decode(path, fixed)
        raise TraceError(f"{path}: not valid JSON ({exc})") from None


def _decode_tolerant(path: str, raw: bytes) -> TraceFile | list[Event]:
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:  # pragma: no cover - the typed decoder saw it first
        raise TraceError(f"{path}: not valid JSON ({exc})") from None
    items = (
        doc if isinstance(doc, list) else doc.get("traceEvents") if isinstance(doc, dict) else None
    )
    if not isinstance(items, list):
        raise TraceError(f"{path}: not a Chrome trace (no traceEvents)")
    events = []
    for item in items:
        try:
            events.append(msgspec.convert(item, Event, strict=False))
        except msgspec.ValidationError:
            continue
    if isinstance(doc, list):
        return events
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    try:
        trace = msgspec.convert(header, TraceFile, strict=False)
    except msgspec.ValidationError:
        trace = TraceFile()
    trace.traceEvents = events
    return trace


def _devices(trace: TraceFile) -> list[Device]:
    props = trace.deviceProperties or trace.computeProperties or []
    devices = []
    for i, p in enumerate(props):
        devices.append(
            Device(
                index=p.id if p.id is not None else i,
                name=p.name,
                total_memory=p.totalGlobalMem,
                compute_major=p.computeMajor if p.computeMajor is not None else p.major,
                compute_minor=p.computeMinor if p.computeMinor is not None else p.minor,
            )
        )
    return devices


def load_trace(path: str | os.PathLike, limits: LoadLimits = DEFAULT_LIMITS) -> TraceData:
    """Read and file the events of one trace. Raises ``TraceError`` with a one-line message."""
    path = os.fspath(path)
    raw = _read_bytes(path, limits)
    # An upper bound on the events (every event has a "ph"), counted before decoding: the
    # decoded events cost ~10x their JSON, so the bound is checked before that is spent.
    if raw.count(b'"ph"') > limits.max_events:
        raise TraceError(f"{path}: more than {limits.max_events} events; if it is a real "
                         "trace, raise the limit with `gputop analyze --max-events`")
    try:
        doc = _decode(path, raw)
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply to be a trace") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text, not a trace") from None
    del raw
    if isinstance(doc, list):
        events, data = doc, TraceData(path=path)
    else:
        if doc.traceEvents is None:
            raise TraceError(f"{path}: not a Chrome trace (no traceEvents)")
        events, data = doc.traceEvents, TraceData(path=path, devices=_devices(doc))
        if doc.distributedInfo is not None:
            data.rank = doc.distributedInfo.rank
            data.world_size = doc.distributedInfo.world_size
            data.backend = doc.distributedInfo.backend
    data.n_events = len(events)
    _file_events(data, events)
    if not (data.steps or data.cpu_ops or data.runtime or data.kernels or data.python):
        raise TraceError(f"{path}: no profiler events (not a torch.profiler trace?)")
    return data


def _file_events(data: TraceData, events: list[Event]) -> None:
    # One pass, one dict lookup per event: categories map to the list they are filed in (the
    # lower-cased spelling is only computed for categories not seen before).
    targets = {
        "cpu": data.cpu_ops.append,
        "python": data.python.append,
        "runtime": data.runtime.append,
        "kernel": data.kernels.append,
        "memcpy": data.memcpys.append,
        "memset": data.memsets.append,
        "gpu_sync": data.gpu_syncs.append,
        "gpu_range": data.gpu_ranges.append,
    }
    cpu_op = targets["cpu"]  # the same bound method object, so `is` below matches it
    route: dict[str, object] = {}
    step, memory = data.steps.append, data.memory.append
    inf = math.inf
    dropped = 0
    for ev in events:
        ph = ev.ph
        if not (-inf < ev.ts < inf and 0.0 <= ev.dur < inf):
            dropped += 1  # a negative or non-finite time: a broken writer; never measured
            continue
        if ph == "X":
            cat = ev.cat
            target = route.get(cat)
            if target is None:
                target = route[cat] = targets.get(_ROLE_OF_CATEGORY.get(cat.lower(), ""), False)
            if target is cpu_op:
                if ev.name.startswith("ProfilerStep#"):
                    step(ev)
                else:
                    cpu_op(ev)
            elif target:
                target(ev)
            elif cat.lower() == "trace" and ev.dur > 0:
                data.profiler_span = (ev.ts, ev.ts + ev.dur)
        elif ph == "i" or ph == "I":
            if ev.name == "[memory]":
                memory(ev)
    data.dropped_events = dropped
