"""What work already queued on an idle device waits for.

When a device idles although its next work was launched before it ran dry, the host is not the
cause: the work is in a stream's queue and cannot start. CUDA starts a stream's next work when
the work before it on that stream is done and every dependency put on the stream has been met,
so a trace can name the dependency it recorded, in this order:

``graph``         the work is a node of a CUDA graph (launched together by cudaGraphLaunch): the
                  graph runs its nodes in its own dependency order, with host nodes and event
                  waits between them
``stream-wait``   the stream was told to wait on another stream's event (cudaStreamWaitEvent,
                  ``stream.wait_stream``): a cross-stream dependency, with the stream waited on
                  where CUPTI recorded it (a ``Stream Wait Event`` record)
``other-device``  another GPU of the process was busy meanwhile: the work waits for it
``collective``    the work is a collective, queued behind its communication stream's
                  dependencies
``unrecorded``    nothing in the trace: another process on the GPU, a host callback
                  (cudaLaunchHostFunc), work launched before the trace started

None of these is the host's doing, so no host cause (a sync the host sat in meanwhile
included) is charged for queued idle; HTA leaves such time as "other" idle.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

from gputop.diagnostics.trace.measuring.gaps import Attribution
from gputop.diagnostics.trace.measuring.intervals import RangeIndex, Ranges

STREAM_WAIT_APIS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"})
REASONS = ("graph", "stream-wait", "other-device", "collective", "unrecorded")
REASON_TEXT = {
    "graph": "the nodes of a CUDA graph (its own dependencies, between nodes launched together "
             "by cudaGraphLaunch)",
    "stream-wait": "a cross-stream dependency (cudaStreamWaitEvent)",
    "other-device": "work on another GPU",
    "collective": "a collective's stream dependencies",
    "unrecorded": "nothing this trace recorded (another process on the GPU, a host callback, "
                  "work launched before the trace)",
}


class Queued(NamedTuple):
    """The inputs that name a dependency (see the module docstring)."""

    # (device, stream) -> sorted times of CUPTI's "Stream Wait Event" records on that stream,
    # and the stream each waited on (None when not recorded)
    stream_waits: dict[tuple[int, int], tuple[list[float], list[int | None]]]
    # launching thread -> sorted times of its cudaStreamWaitEvent calls (no stream recorded)
    host_waits: dict[object, list[float]]
    graph_corrs: frozenset[int]  # correlations of graph launches


def queued_inputs(stream_waits: list[tuple[int, int, float, int | None]], runtime,
                  graph_corrs: frozenset[int]) -> Queued:
    """``stream_waits``: (device, stream, time, stream waited on) of each Stream Wait Event."""
    waits: dict[tuple[int, int], list[tuple[float, int | None]]] = defaultdict(list)
    for device, stream, ts, on in stream_waits:
        waits[(device, stream)].append((ts, on))
    host: dict[object, list[float]] = defaultdict(list)
    for rt in runtime:
        if rt.name in STREAM_WAIT_APIS:
            host[rt.tid].append(rt.ts)
    for times in host.values():
        times.sort()
    by_stream = {}
    for key, rows in waits.items():
        rows.sort(key=lambda r: r[0])
        by_stream[key] = ([ts for ts, _ in rows], [on for _, on in rows])
    return Queued(by_stream, dict(host), graph_corrs)


class Namer:
    """Names the dependency of each queued gap on one device: (reason, detail)."""

    def __init__(self, q: Queued, device: int, dacts, launches, busy_other: dict[int, Ranges]):
        self.q, self.device, self.launches = q, device, launches
        by_stream: dict[int, list] = defaultdict(list)
        for a in dacts:  # sorted by start
            by_stream[a.stream].append(a)
        self.by_stream = by_stream
        self.starts = {s: [a.ts for a in acts] for s, acts in by_stream.items()}
        self.others = {d: RangeIndex(r) for d, r in busy_other.items() if r}

    def why(self, filler, launch, g0: float, g1: float) -> tuple[str, str]:
        if filler.correlation in self.q.graph_corrs:
            return "graph", ""
        # The stream's previous work and when it was launched: a wait put on the stream after
        # that launch and before this one stands between the two.
        stream = filler.stream
        i = bisect_left(self.starts.get(stream, []), filler.ts) - 1
        prev = self.by_stream[stream][i] if i >= 0 else None
        prev_launch = self.launches.get(prev.correlation) if prev is not None else None
        since = prev_launch.ts if prev_launch is not None else float("-inf")
        waits = self.q.stream_waits.get((self.device, stream))
        if waits:
            j = bisect_right(waits[0], since)
            if j < len(waits[0]) and waits[0][j] <= launch.ts:
                on = waits[1][j]
                return "stream-wait", (f"stream {stream} waits on stream {on}" if on is not None
                                       else f"stream {stream}")
        host = self.q.host_waits.get(launch.tid)
        if host:
            j = bisect_right(host, since)
            if j < len(host) and host[j] <= launch.ts:
                return "stream-wait", f"stream {stream}"
        for dev, index in self.others.items():
            if index.covered(g0, g1) > 0:
                return "other-device", f"GPU {dev}"
        if filler.kind == "comm":
            return "collective", ""
        return "unrecorded", ""


def queued_label(reason: str, detail: str) -> str:
    """The words for a reason, with its detail: "a cross-stream dependency (cudaStreamWaitEvent:
    stream 20 waits on stream 7)"."""
    text = REASON_TEXT[reason]
    if not detail:
        return text
    if text.endswith(")"):
        return f"{text[:-1]}: {detail})"
    return f"{text} ({detail})"


def waits_for(att: Attribution, name_inputs: Callable[[], Queued], n_devices: int,
              limit: int = 300) -> list[dict]:
    """Queued idle by what it waited for, largest first: ``{"reason", "label", "ms"}``, ms per
    device (averaged like the step breakdown). As with the idle labels, only the ``limit``
    longest pieces are named (the rest are summed as shorter pieces), and details beyond the
    top five of a reason are summed under the reason alone."""
    pieces = att.queued_pieces
    if not pieces:
        return []
    longest = heapq.nsmallest(limit, pieces, key=lambda p: p[0] - p[1])
    q = name_inputs()
    namers: dict[int, Namer] = {}
    why: dict[tuple[str, str], float] = defaultdict(float)
    for g0, g1, dev, filler, launch in longest:
        if dev not in namers:
            namers[dev] = Namer(q, dev, att.by_device[dev], att.launches,
                                {d: b for d, b in att.busy.items() if d != dev})
        why[namers[dev].why(filler, launch, g0, g1)] += g1 - g0
    rows: dict[tuple[str, str], float] = {}
    per_reason: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for (reason, detail), us in why.items():
        per_reason[reason].append((detail, us))
    for reason, details in per_reason.items():
        details.sort(key=lambda d: -d[1])
        for detail, us in details[:5]:
            rows[(reason, detail)] = us
        rest = sum(us for _, us in details[5:])
        if rest:
            rows[(reason, "")] = rows.get((reason, ""), 0.0) + rest
    shorter = sum(g1 - g0 for g0, g1, *_ in pieces) - sum(g1 - g0 for g0, g1, *_ in longest)
    n = max(1, n_devices)
    out = [{"reason": reason, "label": queued_label(reason, detail), "ms": round(us / 1e3 / n, 3)}
           for (reason, detail), us in sorted(rows.items(), key=lambda kv: -kv[1])]
    if shorter:
        out.append({"reason": "unnamed", "label": "shorter pieces not named",
                    "ms": round(shorter / 1e3 / n, 3)})
    return [row for row in out if row["ms"] > 0]
