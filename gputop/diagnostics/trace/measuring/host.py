"""What each host thread was doing, instant by instant: the host side of gap attribution.

Every recorded instant of a thread gets one state, by priority (the most specific cause wins):

``startup``     CUDA/HIP driver initialisation and module loading (a bookkeeping call of 1 ms or
                more, a kernel launch that long), CUDA graph capture and instantiation, and
                torch.compile's compilation phases (``(dynamo_timed)`` annotations)
``dataloader``  inside ``enumerate(DataLoader)#...__next__``
``sync``        waiting for the device: stream/event/device synchronize, device-to-host copies
                (``.item()``, ``.cpu()``), and, where collectives run on a CPU thread (gloo), the
                host's wait for one
``copy``        a blocking or pageable host-to-device copy call (the host stages the data)
``allocator``   cudaMalloc/cudaFree and friends
``launch``      the launch path: runtime calls, the CPU time of operators that launch GPU work,
                and the short stretches of Python between operators (under ``INTER_OP_US``)
``host``        host work that launches nothing: operators on CPU tensors, and longer stretches
                of Python (named when the trace has Python stacks)
``unprofiled``  nothing recorded: Python without stacks, I/O, or a wait the profiler cannot see

Operators are the dispatcher's (names with a ``::`` namespace: ``aten::``, ``c10d::``, custom op
libraries). ``record_function`` ranges and user annotations (``## forward ##``,
``Optimizer.step#...``) wrap whole phases; they only name the time inside them.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from gputop.diagnostics.trace.loading.load import Event
from gputop.diagnostics.trace.measuring.intervals import (
    RangeIndex,
    Ranges,
    intersect,
    merge,
    merge_sorted,
    subtract,
)
from gputop.diagnostics.trace.measuring.kernels import (
    ALLOC_APIS,
    COLLECTIVE_PREFIXES,
    COMPILE_MARK,
    DATALOADER_PREFIX,
    DRIVER_INIT_US,
    GRAPH_LAUNCH_APIS,
    ITEM_OPS,
    LAUNCH_APIS,
    SYNC_APIS,
    is_blocking_copy_api,
    is_capture_begin,
    is_capture_end,
    is_host_collective_wait,
    is_startup_api,
)

# Python between two operators of a launch path: a module call, a hook, a loop over parameters.
# One eager operator costs ~10 us of host time to dispatch and launch, so a stretch with no
# operator ten times that long is the program doing something else, not launching.
INTER_OP_US = 100.0

HOST_STATES = (
    "startup",
    "dataloader",
    "sync",
    "copy",
    "allocator",
    "launch",
    "host",
    "unprofiled",
)
# Painting order; "device" is the CPU model's own compute (never an idle cause).
_PAINT_ORDER = ("device", "startup", "dataloader", "sync", "copy", "allocator", "launch",
                "op_host")


@lru_cache(maxsize=8192)
def op_kind(name: str, cat: str) -> str:
    """What a host event is, by name (cached: a trace repeats a few hundred names)."""
    if name.startswith(DATALOADER_PREFIX):
        return "dataloader-next" if name.endswith("__next__") else "dataloader"
    if COMPILE_MARK in name:
        return "compile"
    if is_host_collective_wait(name):
        return "wait"
    if name in ITEM_OPS:
        return "item"
    if name.startswith(COLLECTIVE_PREFIXES):
        kind = "collective"
    else:
        kind = ""
    if (cat == "cpu_op" or cat == "Operator") and "::" in name:
        return "collective-op" if kind else "operator"
    return "collective-mark" if kind else "mark"


def _outermost(events: list[Event]) -> list[Event]:
    """Events not nested in another of the list (the list sorted by start, longest first)."""
    out: list[Event] = []
    end = float("-inf")
    for ev in events:
        if ev.ts >= end:
            out.append(ev)
            end = ev.ts + ev.dur
        elif ev.ts + ev.dur > end:  # overlapping but not nested (a broken writer): extend
            end = ev.ts + ev.dur
    return out


class Frames:
    """The innermost Python frame at an instant, without indexing 100 000s of frames: the last
    frame that started before ``t`` either covers it or is nested in the frame that does, so
    the answer is found by walking its parents (python_parent_id). The parent index is built on
    the first question only."""

    def __init__(self, frames: list[Event]) -> None:
        self.frames = frames  # sorted by (start, -duration)
        self._starts: list[float] | None = None
        self._by_id: dict = {}

    def _build(self) -> None:
        self._starts = [ev.ts for ev in self.frames]
        self._by_id = {
            ev.args.python_id: ev for ev in self.frames
            if ev.args is not None and ev.args.python_id is not None
        }

    def parent(self, frame: Event) -> Event | None:
        pid = frame.args.python_parent_id if frame.args is not None else None
        return self._by_id.get(pid) if pid is not None else None

    def at(self, t: float) -> Event | None:
        if self._starts is None:
            self._build()
        i = bisect_right(self._starts, t) - 1
        if i < 0:
            return None
        frame: Event | None = self.frames[i]
        hops = 0
        while frame is not None and hops < 256:
            if frame.ts <= t < frame.ts + frame.dur:
                return frame
            frame = self.parent(frame)
            hops += 1
        return None


class Disjoint:
    """"Which event covers ``t``" for events that do not nest (outermost operators; runtime
    calls, where a driver call inside a runtime call is the rare exception): one bisection,
    then a few steps back for a nested one."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events  # sorted by (start, -duration)
        self._starts: list[float] | None = None

    def at(self, t: float) -> Event | None:
        if self._starts is None:
            self._starts = [ev.ts for ev in self.events]
        i = bisect_right(self._starts, t) - 1
        for j in range(i, max(-1, i - 4), -1):
            ev = self.events[j]
            if ev.ts + ev.dur > t:
                return ev
        return None


class Innermost:
    """"Which event covers ``t``, innermost first" for properly nested events of one thread.

    Built lazily on the first question, by one sweep with a stack, as disjoint segments each
    naming its innermost event; a question is then one bisection. (Nested events start after
    their parents and siblings do not overlap, so the innermost event at any instant is the
    one that started last among those still running.)"""

    def __init__(self, events: list[Event]) -> None:
        self.events = events  # sorted by (start, -duration)
        self._starts: list[float] | None = None
        self._ends: list[float] = []
        self._owner: list[Event | None] = []

    def _build(self) -> None:
        starts, ends, owner = [], [], []
        stack: list[Event] = []
        cursor = float("-inf")

        def emit(upto: float) -> None:
            nonlocal cursor
            if upto > cursor:
                starts.append(cursor)
                ends.append(upto)
                owner.append(stack[-1] if stack else None)
                cursor = upto

        for ev in self.events:
            ts = ev.ts
            while stack and stack[-1].ts + stack[-1].dur <= ts:
                emit(stack[-1].ts + stack[-1].dur)
                stack.pop()
            emit(ts)
            stack.append(ev)
        while stack:
            emit(stack[-1].ts + stack[-1].dur)
            stack.pop()
        self._starts, self._ends, self._owner = starts, ends, owner

    def at(self, t: float) -> Event | None:
        if self._starts is None:
            self._build()
        i = bisect_right(self._starts, t) - 1
        if i < 0 or t >= self._ends[i]:
            return None
        return self._owner[i]


def python_label(name: str) -> str:
    """``train.py(42): preprocess`` -> ``preprocess (train.py:42)``."""
    head, sep, func = name.partition("): ")
    if not sep or "(" not in head:
        return name
    path, _, line = head.rpartition("(")
    return f"{func} ({path.rsplit('/', 1)[-1]}:{line})"


# Python whose job is to issue device work, by where its code lives (with_stack frame names,
# ``path(line): function``): the wrappers torch.compile generates (Inductor's output code, in
# the torchinductor_<user> cache) and the runtime that calls them (Inductor's runtime and CUDA
# graph trees, AOT autograd's runtime wrappers), Triton's launchers (JIT specialisation, the
# driver's launch), and module hooks that move weights to the device before a forward
# (accelerate's and diffusers' offloading hooks).
_LAUNCH_CODE = re.compile(
    r"torchinductor_|(?:^|/)torch/_inductor/(?:runtime/|cudagraph_trees\.py|output_code\.py)"
    r"|(?:^|/)torch/_functorch/_aot_autograd/runtime_wrappers\.py"
    r"|(?:^|/)triton/(?:runtime/|backends/|knobs\.py)"
    r"|(?:^|/)triton/compiler/compiler\.py\(\d+\): (?:run|launch_metadata|__getattribute__|"
    r"_init_handles)"
    r"|(?:^|/)accelerate/hooks\.py|(?:^|/)diffusers/hooks/"
)
# Compilation is not a launch even inside a launcher (Triton's JIT compiles on a first call).
_COMPILE_CODE = re.compile(
    r"(?:^|/)triton/compiler/(?!compiler\.py\(\d+\): (?:run|launch_metadata|__getattribute__"
    r"|_init_handles))|(?:^|/)torch/_inductor/(?:compile_fx|codecache|graph|scheduler|codegen/"
    r"|select_algorithm|autotune_process|async_compile)|(?:^|/)torch/_dynamo/"
)


@lru_cache(maxsize=16384)
def frame_code(name: str) -> str:
    """``launch``, ``compile``, ``program`` (the user's own code) or ``library`` (torch, the
    standard library, builtins: takes the kind of its caller) for a with_stack frame name."""
    if _COMPILE_CODE.search(name):
        return "compile"
    if _LAUNCH_CODE.search(name):
        return "launch"
    if any(mark in name for mark in _LIBRARY_MARKS):
        return "library"
    return "program"


def launch_code_spans(frames: list[Event], within: Ranges) -> Ranges:
    """The parts of ``within`` where the innermost frame that is not library code is launch
    code (``frame_code``), for one thread's frames sorted by (start, -duration).

    Library frames take the kind of their caller, so they are left out and the rest swept with
    a stack of the open frames; only frames that overlap launch code inside ``within`` matter
    (the walk up from an instant inside a launch-code frame ends at that frame at the latest)."""
    kind = {name: frame_code(name) for name in {ev.name for ev in frames}}
    if "launch" not in kind.values():
        return []
    marked = [ev for ev in frames if kind[ev.name] != "library"]
    region = intersect(within, merge_sorted(
        [(ev.ts, ev.ts + ev.dur) for ev in marked if kind[ev.name] == "launch"]))
    if not region:
        return []
    starts, ends = [a for a, _ in region], [b for _, b in region]
    n = len(ends)
    out: Ranges = []
    stack: list[tuple[float, bool]] = []  # (end, launch code)
    cursor = float("-inf")
    for ev in marked:
        ts = ev.ts
        end = ts + ev.dur
        i = bisect_right(ends, ts)
        if i == n or starts[i] >= end:
            continue  # outside every launch-code part of the region
        while stack and stack[-1][0] <= ts:
            top_end, launching = stack.pop()
            if top_end > cursor:
                if launching:
                    out.append((cursor, top_end))
                cursor = top_end
        if stack and stack[-1][1] and ts > cursor:
            out.append((cursor, ts))
        if ts > cursor:
            cursor = ts
        stack.append((end, kind[ev.name] == "launch"))
    while stack:
        top_end, launching = stack.pop()
        if top_end > cursor:
            if launching:
                out.append((cursor, top_end))
            cursor = top_end
    return intersect(merge_sorted(out), region)


_LIBRARY_MARKS = ("site-packages/", "dist-packages/", "/lib/python3", "torch/", "<built-in",
                  "<frozen")


@dataclass
class ThreadStates:
    tid: object
    painted: dict[str, Ranges] = field(default_factory=dict)
    index: dict[str, RangeIndex] = field(default_factory=dict)
    ops: Disjoint = field(default_factory=lambda: Disjoint([]))  # outermost operators
    all_ops: list[Event] = field(default_factory=list)  # every host event, (start, -duration)
    frames: Frames = field(default_factory=lambda: Frames([]))  # python frames
    marks: Innermost = field(default_factory=lambda: Innermost([]))  # annotations, ranges
    calls: Disjoint = field(default_factory=lambda: Disjoint([]))  # runtime calls
    device: Ranges = field(default_factory=list)  # CPU model: the operators' own compute
    reads: Ranges = field(default_factory=list)  # blocked in device-to-host reads

    def split(self, intervals: Ranges) -> dict[str, Ranges]:
        """Partition disjoint, sorted ``intervals`` by this thread's state."""
        out: dict[str, Ranges] = {}
        rest = intervals
        for state in HOST_STATES[:-1]:
            ranges = self.painted.get(state)
            if not ranges or not rest:
                continue
            got = intersect(rest, ranges)
            if got:
                out[state] = got
                rest = subtract(rest, got)
        if rest:
            out["unprofiled"] = rest
        return out

    def in_state(self, state: str, intervals: Ranges) -> Ranges:
        ranges = self.painted.get(state)
        return intersect(intervals, ranges) if ranges and intervals else []

    def label(self, state: str, t: float) -> str:
        """What the thread was doing at ``t``, in words, for the evidence of a finding."""
        if state in ("sync", "copy", "allocator", "startup"):
            call = self.calls.at(t)
            if call is not None:
                return call.name
        if state in ("host", "launch", "sync", "startup"):
            op = self.ops.at(t)
            if op is not None:
                return op.name
            frame = self._user_frame(t)
            if frame is not None:
                return frame
        mark = self.marks.at(t)
        if state == "dataloader" and mark is not None:
            return mark.name
        if mark is not None and COMPILE_MARK in mark.name:
            return f"torch.compile: {mark.name.replace(COMPILE_MARK, '').strip()}"
        if mark is not None:
            return f"inside {mark.name}"
        return "no profiled activity"

    def _user_frame(self, t: float) -> str | None:
        """The innermost Python frame at ``t`` that is the program's own code (not a builtin,
        torch or another installed library), else the innermost frame that is not a builtin."""
        frame = self.frames.at(t)
        first_named = None
        hops = 0
        while frame is not None and hops < 64:
            name = frame.name
            if not name.startswith("<built-in"):
                if first_named is None:
                    first_named = name
                if not any(mark in name for mark in _LIBRARY_MARKS):
                    return python_label(name)
            frame = self.frames.parent(frame)
            hops += 1
        return python_label(first_named) if first_named else None


def build_thread_states(
    cpu_ops: list[Event],
    python: list[Event],
    runtime: list[Event],
    copy_kind: Callable[[Event], tuple[str | None, bool]],
    cpu_model: bool,
) -> dict[object, ThreadStates]:
    """Paint every host thread's timeline (see the module docstring).

    ``copy_kind(call)`` gives a copy call's direction (``"DtoH"``, ``"HtoD"``, ...) and whether
    a pageable buffer was involved. ``cpu_model``: the trace has no GPU activity, so the
    operators themselves are the device's work (never a host state)."""
    by_tid: dict[object, dict[str, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for ev in cpu_ops:
        by_tid[ev.tid]["ops"].append(ev)
    for ev in python:
        by_tid[ev.tid]["python"].append(ev)
    for ev in runtime:
        by_tid[ev.tid]["runtime"].append(ev)
    return {
        tid: _paint(tid, groups, copy_kind, cpu_model) for tid, groups in by_tid.items()
    }


@lru_cache(maxsize=4096)
def runtime_kind(name: str) -> str:
    """What a runtime call is for the host thread, by name (cached: a trace repeats a few
    dozen names hundreds of thousands of times). "bookkeeping" calls are start-up when long."""
    if name in LAUNCH_APIS:
        return "launch"
    if name in GRAPH_LAUNCH_APIS:
        return "graph-launch"  # a big graph takes long to launch: never start-up
    if name in SYNC_APIS:
        return "sync"
    if is_blocking_copy_api(name):
        return "copy"
    if name.startswith(("cudaMemcpyAsync", "hipMemcpyAsync")):
        return "copy-async"
    if name in ALLOC_APIS:
        return "allocator"
    if is_capture_begin(name):
        return "capture-begin"
    if is_capture_end(name):
        return "capture-end"
    if is_startup_api(name, 0.0):
        return "startup"
    if is_startup_api(name, DRIVER_INIT_US):
        return "bookkeeping"
    return "work"


def _spans(events: Iterable[Event]) -> list[tuple[float, float]]:
    return [(ev.ts, ev.ts + ev.dur) for ev in events]


def _paint(tid, groups, copy_kind, cpu_model: bool) -> ThreadStates:
    st = ThreadStates(tid)
    raw: dict[str, list[tuple[float, float]]] = defaultdict(list)

    calls = sorted(groups.get("runtime", ()), key=lambda e: (e.ts, -e.dur))
    st.calls = Disjoint(calls)
    call_starts = [ev.ts for ev in calls]
    capture_from = None
    d2h: list[tuple[float, float]] = []  # device-to-host copies: the host reads a value
    launch = raw["launch"]
    for ev in calls:
        kind = runtime_kind(ev.name)
        if kind == "launch":  # by far the most frequent: decided first
            if ev.dur >= DRIVER_INIT_US:
                raw["startup"].append((ev.ts, ev.ts + ev.dur))  # lazy module loading
            else:
                launch.append((ev.ts, ev.ts + ev.dur))
            continue
        span = (ev.ts, ev.ts + ev.dur)
        if kind == "capture-begin":
            capture_from = ev.ts
        elif kind == "capture-end" and capture_from is not None:
            raw["startup"].append((capture_from, span[1]))
            capture_from = None
        if kind == "sync":
            raw["sync"].append(span)
        elif kind in ("copy", "copy-async"):
            direction, pageable = copy_kind(ev)
            if direction == "DtoH":
                d2h.append(span)
            if kind == "copy-async" and not pageable:
                launch.append(span)
            elif direction == "DtoH":
                raw["sync"].append(span)
            else:
                raw["copy"].append(span)
        elif kind == "allocator":
            raw["allocator"].append(span)
        elif kind in ("startup", "capture-begin", "capture-end") or (
            kind == "bookkeeping" and ev.dur >= DRIVER_INIT_US
        ):
            raw["startup"].append(span)
        else:
            launch.append(span)
    if capture_from is not None and calls:  # capture still open when the trace ends
        raw["startup"].append((capture_from, calls[-1].ts + calls[-1].dur))

    ops_all = sorted(groups.get("ops", ()), key=lambda e: (e.ts, -e.dur))
    st.all_ops = ops_all
    operators, marks = [], []
    # CPU model: operators inside a DataLoader fetch or a compilation phase are that phase's
    # work, not the device's.
    phases = RangeIndex(merge(
        (ev.ts, ev.ts + ev.dur) for ev in ops_all
        if COMPILE_MARK in ev.name
        or (ev.name.startswith(DATALOADER_PREFIX) and ev.name.endswith("__next__"))
    )) if cpu_model else None
    for ev in ops_all:
        kind = op_kind(ev.name, ev.cat)
        if kind == "operator" or kind == "collective-op":
            operators.append(ev)
        elif kind == "mark" or kind == "collective-mark" or kind == "dataloader":
            marks.append(ev)
        elif kind == "dataloader-next":
            raw["dataloader"].append((ev.ts, ev.ts + ev.dur))
            marks.append(ev)
        elif kind == "compile":
            raw["startup"].append((ev.ts, ev.ts + ev.dur))
            marks.append(ev)
        elif kind == "wait":
            if cpu_model:
                raw["sync"].append((ev.ts, ev.ts + ev.dur))
            else:
                operators.append(ev)
        elif kind == "item":
            if not cpu_model:
                raw["sync"].append((ev.ts, ev.ts + ev.dur))
            operators.append(ev)
    st.marks = Innermost(marks)
    outer = _outermost(operators)
    st.ops = Disjoint(outer)
    starts = call_starts
    for ev in outer:
        span = (ev.ts, ev.ts + ev.dur)
        if cpu_model:
            # Collective launches are the host's; every other operator is the device's work.
            if ev.name.startswith(("c10d::", "_c10d_functional::")):
                raw["launch"].append(span)
            elif phases.covering(ev.ts) is None:
                raw["device"].append(span)
            continue
        # An operator launches GPU work when a runtime call starts inside it.
        i = bisect_right(starts, ev.ts)
        launches = i < len(starts) and starts[i] < span[1] or (i > 0 and starts[i - 1] == ev.ts)
        raw["launch" if launches else "op_host"].append(span)

    # Device-to-host reads (.item(), .cpu(), .tolist()): the operator around each D2H copy,
    # and aten::item itself. The host needs the value, so it cannot queue work past it.
    reads = [(ev.ts, ev.ts + ev.dur) for ev in operators if ev.name in ITEM_OPS]
    if d2h:
        d2h_starts = [s for s, _ in d2h]
        for ev in outer:
            i = bisect_right(d2h_starts, ev.ts)
            if i < len(d2h_starts) and d2h_starts[i] < ev.ts + ev.dur:
                reads.append((ev.ts, ev.ts + ev.dur))
        reads.extend(d2h)
    frames = sorted(groups.get("python", ()), key=lambda e: (e.ts, -e.dur))
    if cpu_model:
        for ev in frames:
            if is_host_collective_wait(ev.name):
                raw["sync"].append((ev.ts, ev.ts + ev.dur))
    st.frames = Frames(frames)

    taken: Ranges = []
    painted: dict[str, Ranges] = {}
    for state in _PAINT_ORDER:
        spans = raw.get(state)
        if not spans:
            continue
        mine = subtract(merge(spans), taken) if taken else merge(spans)
        painted[state] = mine
        taken = merge(taken + mine)
    # Between the recorded events: short stretches are the launch path's Python, longer ones
    # are host work (named by the Python frames when the trace has them) or nothing recorded.
    # The stretches before the thread's first operator and after its last are open-ended.
    short, long = [], []
    for (_, a), (b, _) in zip(taken, taken[1:]):
        if b > a:
            (short if b - a < INTER_OP_US else long).append((a, b))
    if frames:
        first = min(frames[0].ts, taken[0][0]) if taken else frames[0].ts
        last = max(ev.ts + ev.dur for ev in _outermost(frames))
        if taken:
            last = max(last, taken[-1][1])
            long = [(first, taken[0][0]), *long, (taken[-1][1], last)]
        else:
            long = [(first, last)]
    if short:
        painted["launch"] = merge(painted.get("launch", []) + short)
    host = painted.pop("op_host", [])
    if frames and long:
        named = intersect(long, merge(_spans(_outermost(frames))))
        if not cpu_model:
            # Python of the code that issues the launches (compiled wrappers, kernel
            # launchers, offloading hooks) is the launch path, however long it runs.
            issuing = launch_code_spans(frames, named)
            if issuing:
                painted["launch"] = merge(painted.get("launch", []) + issuing)
                named = subtract(named, issuing)
        host = merge(host + named)
    st.device = painted.pop("device", [])
    if host:
        painted["host"] = host
    st.painted = {k: v for k, v in painted.items() if v}
    if reads and st.painted.get("sync"):
        st.reads = intersect(merge(reads), st.painted["sync"])
    st.index = {k: RangeIndex(v) for k, v in st.painted.items()}
    return st
