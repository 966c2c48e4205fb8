"""Loading torch.profiler / Kineto Chrome traces (``.json`` and ``.json.gz``), every schema seen
in the wild, fast.

msgspec decodes straight into typed Structs that hold only the fields the analysis reads (about
4x faster and a third of the memory of decoding into dicts); each event is then visited once and
filed by kind. Schema variants handled here so the metrics never see them:

- categories of 2021 (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``) and current
  ones (``cpu_op``, ``user_annotation``, ``python_function``, ``cuda_runtime``, ``cuda_driver``,
  ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_sync``); integer microsecond and float
  timestamps; ROCm (``hip*`` runtime names, string streams such as ``"0x0"``); Triton kernels
  launched through the driver API (``cuLaunchKernel``); ``deviceProperties`` and the older
  ``computeProperties``; the Chrome "JSON array" form (a bare list of events).

Size: a trace up to ``STREAM_ABOVE`` bytes of JSON is decoded whole (the fast path every
normal trace takes); a larger one is read in batches of whole events (``trace_stream``), so
its bytes never sit in memory at once, whatever its size (2 GB and more). What bounds memory is
the events held: at most ``LoadLimits.max_events``; past that the least telling events are cut,
shortest first (``trace_cut``: memory events and instants, then Python frames, then CPU
operators), and the analysis says what was cut. Device work, runtime calls and steps are never
cut: a trace with more of them than the limit is refused, naming the limit.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import msgspec

from gputop.core import trace_cut as trace_cut
from gputop.core.trace_stream import READ, EventSplitter, GzipReader, StreamError

# The bounds and the opening checks live in ``opening``; their names are this module's too.
from gputop.diagnostics.trace.loading.opening import (  # noqa: F401 (re-exported)
    BYTES_PER_EVENT,
    DEFAULT_LIMITS,
    MAX_EVENTS,
    STREAM_ABOVE,
    LoadLimits,
    TraceError,
    open_checked,
    too_large,
)


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
    # record_shapes / with_flops: what an operator computed on (the roofline's FLOPs and bytes).
    input_dims: list | None = msgspec.field(default=None, name="Input Dims")
    input_type: list | None = msgspec.field(default=None, name="Input type")
    concrete: list | None = msgspec.field(default=None, name="Concrete Inputs")
    flops: int | float | None = None


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
    # Written by the gputop agent: {"cut": ["what was cut and why", ...], ...}.
    gputop: dict | None = None


_DECODER = msgspec.json.Decoder(TraceFile | list[Event])
_BATCH_DECODER = msgspec.json.Decoder(list[Event])
_BARE_NA = re.compile(rb'(?<!")N/A(?!")')

# Category (lower-cased) -> role. 2021 traces use capitalised names (Operator, Runtime, ...).
_ROLE_OF_CATEGORY = {
    "cpu_op": "cpu", "operator": "cpu", "user_annotation": "cpu",
    "python_function": "python",
    "cuda_runtime": "runtime", "runtime": "runtime", "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
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
    # What was cut, one line each: by the agent before it wrote the trace, and on loading
    # (over LoadLimits.max_events).
    cut: list[str] = field(default_factory=list)


class _Source:
    """The trace's JSON bytes, read piece by piece (gzip inflated on the way, whatever the file
    is called). Opened without blocking (a FIFO would wait for a writer for ever) and checked
    on the descriptor, so what is checked is what is read."""

    def __init__(self, path: str, limits: LoadLimits) -> None:
        self.path, self.limits, self.total = path, limits, 0
        fd = open_checked(path, limits)
        try:
            self._fh = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        try:
            first = self._fh.read(READ)
        except OSError as exc:
            self.close()
            raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
        if first[:2] == b"\x1f\x8b":  # gzip magic
            self._first, self._read = b"", GzipReader(self._fh, first).read
        else:
            self._first, self._read = first, self._fh.read

    def read(self, n: int) -> bytes:
        if self._first:
            out, self._first = self._first, b""
        else:
            try:
                out = self._read(n)
            except StreamError as exc:
                raise TraceError(f"{self.path}: {exc}") from None
            except OSError as exc:
                raise TraceError(f"{self.path}: cannot read ({exc.strerror or exc})") from None
        self.total += len(out)
        if self.limits.max_bytes is not None and self.total > self.limits.max_bytes:
            raise too_large(self.path, self.limits)
        return out

    def read_up_to(self, size: int) -> bytearray:
        """Up to ``size`` bytes, in one buffer grown in place (msgspec decodes it as it is:
        no second copy of the trace)."""
        buf = bytearray()
        while len(buf) < size:
            chunk = self.read(max(READ, size - len(buf)))
            if not chunk:
                break
            buf += chunk
        return buf

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode(path: str, raw: bytes | bytearray) -> TraceFile | list[Event]:
    if not raw:
        raise TraceError(f"{path}: empty file, not a trace")
    if raw.isspace():  # (strip() would copy the whole trace)
        raise TraceError(f"{path}: only white space ({len(raw)} bytes), not a trace")
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
    events = _tolerant_events(items)
    if isinstance(doc, list):
        return events
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    try:
        trace = msgspec.convert(header, TraceFile, strict=False)
    except msgspec.ValidationError:
        trace = TraceFile()
    trace.traceEvents = events
    return trace


def _tolerant_events(items: object) -> list[Event]:
    events = []
    for item in items if isinstance(items, list) else []:
        try:
            events.append(msgspec.convert(item, Event, strict=False))
        except msgspec.ValidationError:
            continue
    return events


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
    with _Source(path, limits) as src:
        # In a list the callee empties: the bytes are freed as soon as they are decoded.
        head: list = [src.read_up_to(STREAM_ABOVE + 1)]
        if len(head[0]) <= STREAM_ABOVE:
            data = _load_whole(path, head, limits)
        else:
            data = _load_streamed(path, src, head, limits)
    if not (data.steps or data.cpu_ops or data.runtime or data.kernels or data.python):
        raise TraceError(f"{path}: no profiler events (not a torch.profiler trace?)")
    return data


def _load_whole(path: str, head: list[bytes], limits: LoadLimits) -> TraceData:
    raw = head.pop()
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
        events, data = doc.traceEvents, TraceData(path=path)
        _take_header(data, doc)
    guard = _Guard(data, limits.max_events)
    data.n_events = len(events)
    _file_events(data, events)
    guard.check()
    guard.finish()
    return data


def _load_streamed(path: str, src: _Source, head: list[bytes], limits: LoadLimits
                   ) -> TraceData:
    data = TraceData(path=path)
    guard = _Guard(data, limits.max_events)
    splitter = EventSplitter(src.read, _batch_decoder(path), first=head.pop())
    try:
        for events in splitter:
            data.n_events += len(events)
            _file_events(data, events)
            guard.check()
        header = _decode(path, splitter.header or b"[]")
    except StreamError as exc:
        raise TraceError(f"{path}: {exc}") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply to be a trace") from None
    if not isinstance(header, list):
        _take_header(data, header)
    guard.finish()
    return data


def _batch_decoder(path: str):
    def decode(batch: bytes) -> list[Event]:
        try:
            return _BATCH_DECODER.decode(batch)
        except msgspec.ValidationError:
            # A field of an unexpected type: keep every event of the batch that reads.
            return _tolerant_events(msgspec.json.decode(batch))
        except msgspec.DecodeError:
            if b"N/A" in batch:
                fixed = _BARE_NA.sub(b'"N/A"', batch)
                if fixed != batch:
                    return decode(fixed)
            raise

    return decode


def _take_header(data: TraceData, doc: TraceFile) -> None:
    data.devices = _devices(doc)
    if doc.distributedInfo is not None:
        data.rank = doc.distributedInfo.rank
        data.world_size = doc.distributedInfo.world_size
        data.backend = doc.distributedInfo.backend
    data.cut[:0] = _agent_cut_notes(doc.gputop)


MAX_NOTES, MAX_NOTE = 16, 400


def _agent_cut_notes(info: object) -> list[str]:
    """The agent's lines on what it cut, bounded (a trace is untrusted input)."""
    notes = info.get("cut") if isinstance(info, dict) else None
    if not isinstance(notes, list):
        return []
    return [" ".join(n.split())[:MAX_NOTE] for n in notes[:MAX_NOTES] if isinstance(n, str)]


class _Guard:
    """Holds the events of one trace to ``max_events``: past it, the tiers of
    ``trace_cut`` lose their shortest events (memory events and instants, then Python
    frames, then CPU operators), down to three quarters of the limit so that a long trace is
    not cut again at every batch; device work and steps are never cut."""

    def __init__(self, data: TraceData, max_events: int) -> None:
        self.data, self.max_events = data, max_events
        self.min_dur = {trace_cut.PYTHON: -1.0, trace_cut.CPU_OP: -1.0}
        self.cut = [0] * len(trace_cut.TIER_NAMES)
        self.drop_memory = False
        self._seen = {"python": 0, "cpu_ops": 0, "memory": 0}

    def _held(self) -> int:
        d = self.data
        return (len(d.steps) + len(d.cpu_ops) + len(d.python) + len(d.runtime) + len(d.kernels)
                + len(d.memcpys) + len(d.memsets) + len(d.gpu_syncs) + len(d.memory))

    def check(self) -> None:
        d = self.data
        # What came in since the last check meets the thresholds already raised.
        if self.drop_memory:
            self.cut[trace_cut.OTHER] += len(d.memory)
            d.memory = []
        for name, tier in (("python", trace_cut.PYTHON), ("cpu_ops", trace_cut.CPU_OP)):
            floor = self.min_dur[tier]
            events = getattr(d, name)
            seen = self._seen[name]
            if floor >= 0 and len(events) > seen:
                kept = self._keep(events[seen:], tier, floor)
                self.cut[tier] += len(events) - seen - len(kept)
                events[seen:] = kept
            self._seen[name] = len(events)
        excess = self._held() - self.max_events
        if excess <= 0:
            return
        target = excess + self.max_events // 4
        if d.memory and not self.drop_memory:
            self.drop_memory = True
            target -= len(d.memory)
            self.cut[trace_cut.OTHER] += len(d.memory)
            d.memory = []
        for name, tier in (("python", trace_cut.PYTHON), ("cpu_ops", trace_cut.CPU_OP)):
            if target <= 0:
                break
            events = getattr(d, name)
            cuttable = sorted(e.dur for e in events
                              if tier != trace_cut.CPU_OP or not trace_cut.is_key_op(e.name))
            if not cuttable:
                continue
            floor = cuttable[min(len(cuttable) - 1, target)]
            self.min_dur[tier] = max(self.min_dur[tier], floor)
            kept = self._keep(events, tier, self.min_dur[tier])
            target -= len(events) - len(kept)
            self.cut[tier] += len(events) - len(kept)
            setattr(d, name, kept)
            self._seen[name] = len(kept)
        if self._held() > self.max_events:
            raise TraceError(
                f"{d.path}: more than {self.max_events:,} events that are never cut (steps, "
                "device work, runtime calls): analysing it would take over "
                f"{self.max_events * BYTES_PER_EVENT / 1e9:.1f} GB of memory; raise "
                "--max-events if this machine has that")

    @staticmethod
    def _keep(events: list[Event], tier: int, floor: float) -> list[Event]:
        if tier == trace_cut.CPU_OP:
            key = trace_cut.is_key_op
            return [e for e in events if e.dur > floor or key(e.name)]
        return [e for e in events if e.dur > floor]

    def finish(self) -> None:
        if not any(self.cut):
            return
        why = (f"over --max-events {self.max_events:,} held events (about "
               f"{self.max_events * BYTES_PER_EVENT / 1e9:.1f} GB of memory)")
        held = {trace_cut.PYTHON: len(self.data.python), trace_cut.CPU_OP: len(self.data.cpu_ops),
                trace_cut.OTHER: len(self.data.memory)}
        counts = [(held.get(i, 0), n) for i, n in enumerate(self.cut)]
        floors = [None] * len(self.cut)
        for tier, floor in self.min_dur.items():
            if floor >= 0:
                floors[tier] = trace_cut.duration_bin(floor) + 1
        self.data.cut.extend(f"on loading: {line}"
                             for line in trace_cut.describe_cut(counts, floors, why))


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
    data.dropped_events += dropped
