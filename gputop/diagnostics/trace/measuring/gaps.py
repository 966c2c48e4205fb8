"""Gap attribution: every idle instant of the device, given to its cause.

For every interval in which a device has nothing running, inside the judged window, find the
work that ends it (the next activity on that device) and the host call that launched it:

- the launch came *after* the device ran dry: the device waited on the host. From the moment it
  ran dry until the launch, the cause is what the launching thread was doing
  (``measuring/host.py``: a sync, a DataLoader fetch, an allocator call, start-up, the launch path,
  host work, nothing profiled); from the launch to the start of the work, the launch itself.
- the launch call was still running when the device ran dry: the device waits for it (the
  launch path, or what blocked inside the call: a synchronous copy, module loading).
- the launch had returned *before*: the work was already queued and the device waited on a
  dependency (a CUDA graph's own order, another stream's event, another device, something the
  trace did not record): ``queued``, named by ``measuring/queued.py``. Never the host's doing, even
  when the launching thread sat in a synchronisation meanwhile: it waited on the same
  dependency, and syncing less would not have started the work sooner.
- no launch recorded (a trace without CPU events): ``unrecorded``.

A synchronisation therefore costs only the idle time it overlaps: a sync that waited on a busy
device costs nothing. The same code serves traces without GPU activity: there the "device" is
the CPU's own compute (the operators) and the collectives a CPU thread runs (gloo), each launched
by the operator that issued it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import NamedTuple

from gputop.diagnostics.trace.loading.load import Event, TraceData
from gputop.diagnostics.trace.measuring.host import ThreadStates
from gputop.diagnostics.trace.measuring.intervals import (
    RangeIndex,
    Ranges,
    intersect,
    merge,
    merge_sorted,
    subtract,
    total,
)
from gputop.diagnostics.trace.measuring.kernels import kernel_class

BUSY_ROLES = ("compute", "communication", "memcpy", "memset")
IDLE_CAUSES = (
    "sync",
    "copy",
    "allocator",
    "startup",
    "dataloader",
    "launch",
    "host",
    "unprofiled",
    "queued",
    "unrecorded",
)
ROLES = BUSY_ROLES + IDLE_CAUSES


class Activity(NamedTuple):
    """One piece of device work (a kernel, copy or memset; on CPU traces an operator or a
    collective) and the host call that launched it."""

    ts: float
    end: float
    kind: str  # "compute" | "comm" | "memcpy" | "memset"
    device: int
    stream: int
    name: str
    correlation: int | None
    nbytes: int


class Launch(NamedTuple):
    tid: object
    ts: float
    end: float


def as_int(value, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text, 16) if text.lower().startswith("0x") else int(text.split()[-1])
        except (ValueError, IndexError):
            return default
    return default


def gpu_activities(data: TraceData) -> list[Activity]:
    out: list[Activity] = []
    append = out.append
    for kind, events in (("kernel", data.kernels), ("memcpy", data.memcpys),
                         ("memset", data.memsets)):
        for ev in events:
            args = ev.args
            if args is not None:
                device = as_int(args.device if args.device is not None else ev.pid)
                stream = as_int(args.stream if args.stream is not None else ev.tid)
                corr = args.correlation if isinstance(args.correlation, int) else None
                nbytes = as_int(args.bytes) if args.bytes is not None else 0
            else:
                device, stream, corr, nbytes = as_int(ev.pid), as_int(ev.tid), None, 0
            if kind == "kernel":
                k = "comm" if kernel_class(ev.name)[0] else "compute"
            else:
                k = kind
            append(Activity(ev.ts, ev.ts + ev.dur, k, device, stream, ev.name, corr, nbytes))
    out.sort()
    return out


CPU_DEVICE = -1  # the device index of a CPU-only trace's own compute
# On CPU-only traces the "device" is other CPU threads: when a collective's worker thread
# finishes, the thread waiting on it becomes runnable but may wait for a CPU up to the
# scheduler's latency period (Linux CFS: sched_latency_ns, 6 ms) on a busy host. That wake-up
# is the host reacting, not the wait costing device time. (A GPU sync returns within
# microseconds of the device finishing: no allowance there.)
CPU_WAKE_US = 6000.0


def cpu_activities(
    data: TraceData, states: dict[object, ThreadStates]
) -> tuple[list[Activity], dict[int, Launch]]:
    """The CPU model: operators' compute (launched by themselves) and collectives run by a
    worker thread (gloo), each matched in order to the ``c10d::`` operator that issued it."""
    acts: list[Activity] = []
    launches: dict[int, Launch] = {}
    corr = 0
    for tid, st in states.items():
        for s, e in st.device:
            corr += 1
            acts.append(Activity(s, e, "compute", CPU_DEVICE, as_int(tid), "operators", corr, 0))
            launches[corr] = Launch(tid, s, s)
    issued = deque(
        sorted((ev.ts, ev.ts + ev.dur, ev.tid) for ev in data.cpu_ops
               if ev.name.startswith("c10d::") and ev.cat in ("cpu_op", "Operator"))
    )
    for ev in sorted((e for e in data.cpu_ops if e.name.startswith(("gloo:", "mpi:", "ucc:"))),
                     key=lambda e: e.ts):
        corr += 1
        acts.append(Activity(ev.ts, ev.ts + ev.dur, "comm", CPU_DEVICE, as_int(ev.tid),
                             ev.name, corr, 0))
        while issued and issued[0][0] <= ev.ts:
            ts, end, tid = issued.popleft()
            if not issued or issued[0][0] > ev.ts:
                launches[corr] = Launch(tid, ts, end)
                break
    acts.sort()
    return acts, launches


@dataclass
class Attribution:
    """Per role, the ranges of device time it covers, per device (busy roles and idle causes
    together partition the window of every device)."""

    devices: list[int]
    roles: dict[str, dict[int, Ranges]] = field(default_factory=dict)
    # (device, tid) of each idle piece's launching thread, to name what it was doing.
    owners: dict[str, list[tuple[float, float, object]]] = field(default_factory=dict)
    gaps: dict[int, Ranges] = field(default_factory=dict)  # every idle interval, per device
    busy: dict[int, Ranges] = field(default_factory=dict)  # union of activity, per device
    kinds: dict[int, dict[str, Ranges]] = field(default_factory=dict)  # per kind, per device
    main_tid: object = None
    # Queued idle pieces, to name what the work waited for (lazily, ``measuring/queued.py``):
    # (start, end, device, the work that ended the gap, its launch).
    queued_pieces: list[tuple[float, float, int, Activity, Launch]] = field(default_factory=list)
    by_device: dict[int, list[Activity]] = field(default_factory=dict)
    launches: dict[int, Launch] = field(default_factory=dict)

    def ranges(self, role: str) -> Ranges:
        """The role's ranges over every device, as one sorted list (may overlap across
        devices)."""
        out: Ranges = []
        for r in self.roles.get(role, {}).values():
            out.extend(r)
        out.sort()
        return out

    def total_us(self, role: str) -> float:
        return sum(total(r) for r in self.roles.get(role, {}).values())


def _busy_roles(acts: list[Activity]) -> tuple[dict[str, Ranges], dict[str, Ranges]]:
    """Busy time by role, most specific first: compute, then communication not hidden by
    compute (exposed), then copies, then memsets; and each kind's own union."""
    by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a in acts:  # sorted by start: each kind's list is too
        by_kind[a.kind].append((a.ts, a.end))
    kinds = {kind: merge_sorted(spans) for kind, spans in by_kind.items()}
    out: dict[str, Ranges] = {}
    taken: Ranges = []
    for role, kind in (("compute", "compute"), ("communication", "comm"), ("memcpy", "memcpy"),
                       ("memset", "memset")):
        spans = kinds.get(kind, [])
        mine = subtract(spans, taken) if taken else spans
        if mine:
            out[role] = mine
            taken = merge(taken + mine)
    return out, kinds


def attribute(
    acts: list[Activity],
    launches: dict[int, Launch],
    states: dict[object, ThreadStates],
    slots: Ranges,
    main_tid: object,
    has_host: bool,
    wake_us: float = 0.0,
    keep_queued: bool = False,
) -> Attribution:
    """``wake_us``: how long a thread already blocked when the device finished may take to run
    again (see ``CPU_WAKE_US``); that start of the idle is the host's reaction, not a sync.
    ``keep_queued``: keep the queued pieces, to name what they waited for (``measuring/queued.py``)."""
    by_device: dict[int, list[Activity]] = defaultdict(list)
    for a in acts:
        by_device[a.device].append(a)
    att = Attribution(devices=sorted(by_device), main_tid=main_tid, by_device=by_device,
                      launches=launches)
    roles: dict[str, dict[int, Ranges]] = defaultdict(dict)
    owners: dict[str, list[tuple[float, float, object]]] = defaultdict(list)
    empty = ThreadStates(None)
    for dev, dacts in by_device.items():
        busy_roles, kinds = _busy_roles(dacts)
        att.kinds[dev] = kinds
        for role, r in busy_roles.items():
            inside = intersect(r, slots)
            if inside:
                roles[role][dev] = inside
        if len(kinds) == 1:
            att.busy[dev] = next(iter(kinds.values()))
        else:
            att.busy[dev] = merge(r for ranges in kinds.values() for r in ranges)
    for dev, dacts in by_device.items():
        idle = subtract(slots, att.busy[dev])
        att.gaps[dev] = idle
        if not idle:
            continue
        if not has_host:
            roles["unrecorded"][dev] = idle
            continue
        starts = [a.ts for a in dacts]
        # Per launching thread: the parts the host caused, the launch itself, and queued time.
        host_parts: dict[object, Ranges] = defaultdict(list)
        launch_parts: dict[object, Ranges] = defaultdict(list)
        queued_parts: Ranges = []
        wake_parts: Ranges = []
        for g0, g1 in idle:
            i = bisect_left(starts, g1)
            filler = dacts[i] if i < len(dacts) else None
            launch = launches.get(filler.correlation) if filler is not None else None
            if filler is None or launch is None:
                # Idle to the end of the window, or work whose launch was not recorded: what
                # the main thread was doing.
                host_parts[main_tid].append((g0, g1))
                continue
            tid = launch.tid
            if wake_us > 0:
                st = states.get(tid)
                waiting = st.index.get("sync").covering(g0) if st and "sync" in st.index else None
                if waiting is not None:
                    woke = min(g1, waiting[1], g0 + wake_us)
                    wake_parts.append((g0, woke))
                    owners["launch"].append((g0, woke, tid))
                    g0 = woke
                    if g0 >= g1:
                        continue
            if launch.ts > g0:
                cut = min(launch.ts, g1)
                host_parts[tid].append((g0, cut))
                if g1 > cut:
                    launch_parts[tid].append((cut, g1))
            elif launch.end > g0:
                # The launch call was still running when the device ran dry: it is what the
                # device waits for (or what blocked inside it: a synchronous copy, loading).
                launch_parts[tid].append((g0, g1))
            else:
                # Launched and returned before the device ran dry: queued behind a dependency,
                # never the host's doing (``measuring/queued.py``).
                queued_parts.append((g0, g1))
                if keep_queued:
                    att.queued_pieces.append((g0, g1, dev, filler, launch))
        dev_roles: dict[str, list[tuple[float, float]]] = defaultdict(list)
        dev_roles["launch"].extend(wake_parts)
        for tid, parts in host_parts.items():
            st = states.get(tid, empty)
            for state, got in st.split(merge_sorted(parts)).items():
                dev_roles[state].extend(got)
                owners[state].extend((s, e, tid) for s, e in got)
        for tid, parts in launch_parts.items():
            st = states.get(tid, empty)
            parts = merge_sorted(parts)
            special = []
            # The launch call itself may block (a synchronous copy, an allocation, module
            # loading): then that is the cause, not launch overhead.
            for state in ("startup", "sync", "copy", "allocator"):
                got = st.in_state(state, parts)
                if got:
                    dev_roles[state].extend(got)
                    owners[state].extend((s, e, tid) for s, e in got)
                    special.extend(got)
            rest = subtract(parts, merge(special)) if special else parts
            dev_roles["launch"].extend(rest)
            owners["launch"].extend((s, e, tid) for s, e in rest)
        dev_roles["queued"].extend(queued_parts)
        for role, spans in dev_roles.items():
            merged = merge(spans)
            if merged:
                roles[role][dev] = merged
    att.roles = dict(roles)
    for role in owners:
        owners[role].sort()
    att.owners = dict(owners)
    return att


def per_step(att: Attribution, steps, devices: list[int]) -> list[dict[str, float]]:
    """Milliseconds of each role in each step, averaged over ``devices``."""
    indexes = {
        (role, dev): RangeIndex(r)
        for role, by_dev in att.roles.items()
        for dev, r in by_dev.items()
        if dev in devices
    }
    n = max(1, len(devices))
    rows = []
    for s in steps:
        row = dict.fromkeys(ROLES, 0.0)
        for (role, _dev), index in indexes.items():
            row[role] += index.covered(s.start, s.end) / 1e3 / n
        row["total"] = (s.end - s.start) / 1e3
        rows.append(row)
    return rows


def label_pieces(
    att: Attribution, states: dict[object, ThreadStates], role: str, limit: int = 300
) -> list[tuple[str, float]]:
    """What the launching threads were doing in ``role``'s idle time: (label, us), largest
    first. Labels the ``limit`` longest pieces; the rest is summed under "other"."""
    pieces = att.owners.get(role, [])
    if not pieces:
        return []
    ranked = sorted(pieces, key=lambda p: p[0] - p[1])
    sums: dict[str, float] = defaultdict(float)
    for s, e, tid in ranked[:limit]:
        st = states.get(tid)
        name = st.label(role, (s + e) / 2) if st is not None else "no profiled activity"
        sums[name] += e - s
    named = sorted(sums.items(), key=lambda kv: -kv[1])
    rest = sum(e - s for s, e, _ in ranked[limit:])
    return named + ([("shorter pieces not named", rest)] if rest > 0 else [])


def main_thread(data: TraceData, launches_by_tid: dict[object, int]) -> object:
    """The training thread: the one with ProfilerStep spans, else the one launching the most
    device work, else the busiest."""
    if data.steps:
        return data.steps[0].tid
    if launches_by_tid:
        return max(launches_by_tid, key=launches_by_tid.get)
    counts: dict[object, int] = defaultdict(int)
    for ev in data.cpu_ops:
        counts[ev.tid] += 1
    return max(counts, key=counts.get) if counts else None


def events_by_corr(runtime: list[Event]) -> dict[int, Launch]:
    out: dict[int, Launch] = {}
    for rt in runtime:
        corr = rt.args.correlation if rt.args else None
        if isinstance(corr, int):
            out[corr] = Launch(rt.tid, rt.ts, rt.ts + rt.dur)
    return out
