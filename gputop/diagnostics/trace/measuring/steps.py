"""Which part of a trace is judged: its steps, or else the span both sides recorded.

A trace is a window cut out of a running program. Its edges are artefacts: the profiler starts
while the host is mid-step and the GPU still runs work launched before; it stops with a device
synchronize of its own, and the GPU may run on after the host side stopped recording. The
window judged is therefore

- the ``ProfilerStep#N`` spans when the trace has them, made device-aware as the TensorBoard
  profiler plugin does (a step lasts until the GPU work it launched ends, and starts no earlier
  than the previous one ended);
- else the iterations between consecutive ``Optimizer.step`` annotations (the part before the
  first one is an unknown fraction of an iteration, so it is left out);
- else the span in which both the host and the device were recorded: from the later of their
  first events to the earlier of their last ones. Without CPU events it is the device's span and
  only the device side is assessed; without device activity it is the host's span.
"""

from __future__ import annotations

from typing import NamedTuple

from gputop.diagnostics.trace.loading.load import Event, TraceData
from gputop.diagnostics.trace.measuring.kernels import DEVICE_SYNC_APIS


class Step(NamedTuple):
    name: str
    host_start: float
    host_end: float
    start: float  # device-aware span
    end: float


# A first or last step is a one-off when a finding could charge more time in it than in any
# step between them, by this share of the window or more (TensorBoard's profiler plugin acts
# from 5% of the step time; below that a difference does not move a verdict) ...
ONE_OFF_SHARE = 0.05
# ... and when it is an outlier among them by Dixon's Q test at 95% confidence (Q = its gap to
# the nearest step / the range of all; critical values for 3 to 10 values, Rorabacher 1991,
# Anal. Chem. 63:139): on a busy machine the steps' own spread can pass 5% of the window, and
# the test asks for a gap wider than that spread. More than 10 steps use the value for 10,
# which is stricter than theirs.
DIXON_Q95 = {3: 0.970, 4: 0.829, 5: 0.710, 6: 0.625, 7: 0.568, 8: 0.526, 9: 0.493, 10: 0.466}


class Window(NamedTuple):
    steps: list[Step]
    source: str  # "ProfilerStep" | "Optimizer.step" | "recorded span" | "device span" | "none"
    start: float
    end: float
    # Start-up before the window (no-steps traces): time from the first host event to the
    # window's start, for the report's statement of what was left out.
    before_us: float
    after_us: float
    # Steps left out of the judgement as one-offs: (step, "first" | "last", time a finding
    # could charge beyond the costliest steady step).
    one_offs: tuple = ()


def host_span(data: TraceData) -> tuple[float, float] | None:
    first, last = float("inf"), float("-inf")
    for group in (data.cpu_ops, data.runtime, data.python, data.steps):
        for ev in group:
            if ev.ts < first:
                first = ev.ts
            end = ev.ts + ev.dur
            if end > last:
                last = end
    return (first, last) if first <= last else None


def _profiler_steps(data: TraceData) -> list[tuple[float, float, str]]:
    return sorted({(ev.ts, ev.ts + ev.dur, ev.name) for ev in data.steps})


def _optimizer_iterations(data: TraceData) -> list[tuple[float, float, str]]:
    """Traces recorded without prof.step(): an iteration ends where its optimizer step ends."""
    ends = sorted(ev.ts + ev.dur for ev in data.cpu_ops if ev.name.startswith("Optimizer.step#"))
    return [(a, b, f"iteration {i + 1}") for i, (a, b) in enumerate(zip(ends, ends[1:])) if b > a]


def _device_aware(
    host: list[tuple[float, float, str]],
    runtime_sorted: list[Event],
    device_end_by_corr: dict[int, float],
) -> list[Step]:
    """TensorBoard's step model: extend each host step to the end of the GPU work it launched,
    and drop tail steps whose GPU work the profiler may not have captured (none launched, or
    under 80% of the previous step's launches)."""
    n = len(host)
    dev_hi = [float("-inf")] * n
    launched = [0] * n
    i = 0
    for rt in runtime_sorted:
        start, end = rt.ts, rt.ts + rt.dur
        while i < n and start >= host[i][1]:
            i += 1
        if i == n:
            break
        if start < host[i][0] or end > host[i][1]:
            continue
        corr = rt.args.correlation if rt.args else None
        act_end = device_end_by_corr.get(corr) if isinstance(corr, int) else None
        if act_end is not None:
            if act_end > dev_hi[i]:
                dev_hi[i] = act_end
            launched[i] += 1
    steps: list[Step] = []
    prev_end = host[0][0]
    for k, (h_start, h_end, name) in enumerate(host):
        start = max(prev_end, h_start)
        end = max(h_end, dev_hi[k], start)
        steps.append(Step(name, h_start, h_end, start, end))
        prev_end = end
    if any(launched) and n > 1:
        last = max(k for k in range(n) if launched[k])
        keep = last + 1
        if last > 0 and launched[last - 1] * 0.8 > launched[last]:
            keep = last
        steps = steps[:keep]
    return steps


def find_window(
    data: TraceData,
    runtime_sorted: list[Event],
    device_end_by_corr: dict[int, float],
    device_span: tuple[float, float] | None,
) -> Window:
    for find, source in ((_profiler_steps, "ProfilerStep"),
                         (_optimizer_iterations, "Optimizer.step")):
        host = find(data)
        if host:
            steps = _device_aware(host, runtime_sorted, device_end_by_corr)
            if steps:
                # What lies outside the steps is not the program's steady state; not measured.
                return Window(steps, source, steps[0].start, steps[-1].end, 0.0, 0.0)
    hspan = host_span(data)
    if hspan and device_span:
        start, end = max(hspan[0], device_span[0]), min(hspan[1], device_span[1])
        source = "recorded span"
        if end <= start:  # host and device never overlap: judge the device's own span
            start, end, source = device_span[0], device_span[1], "device span"
        return Window([Step("recorded span", start, end, start, end)], source, start, end,
                      max(0.0, start - min(hspan[0], device_span[0])),
                      max(0.0, max(hspan[1], device_span[1]) - end))
    span = device_span or hspan
    if span is None:
        return Window([Step("empty", 0.0, 0.0, 0.0, 0.0)], "none", 0.0, 0.0, 0.0, 0.0)
    source = "device span" if device_span else "recorded span"
    return Window([Step(source, span[0], span[1], span[0], span[1])], source, span[0], span[1],
                  0.0, 0.0)


def steady_steps(win: Window, costs: list[float]) -> Window:
    """Judge the steady steps: a first step that does one-off work (a first-batch copy, a file
    read once, lazy initialisation) or a last step that holds the profiler's shutdown (time
    with nothing recorded before it stops) is left out and reported apart.

    ``costs``: per step, the time a finding could charge (everything but compute and
    communication: a step that computes longer is not dragging the verdict down). An edge step
    is a one-off when its cost exceeds every steady step's by ``ONE_OFF_SHARE`` of the window
    and stands apart from theirs by Dixon's Q test; it needs a step on each side to compare
    with: three steps or more."""
    steps = win.steps
    if win.source not in ("ProfilerStep", "Optimizer.step") or len(steps) < 3:
        return win
    line = ONE_OFF_SHARE * sum(s.end - s.start for s in steps)
    one_offs = []
    for i, position in ((0, "first"), (len(steps) - 1, "last")):
        # Compared with the steps between the edges; with only one of those, with the other
        # edge too (Dixon's test needs three values).
        others = costs[1:-1] if len(steps) > 3 else [c for j, c in enumerate(costs) if j != i]
        gap = costs[i] - max(others)
        if gap >= line and gap / (costs[i] - min(others)) > DIXON_Q95[min(len(others) + 1, 10)]:
            one_offs.append((steps[i], position, gap))
    if not one_offs:
        return win
    first = one_offs[0][1] == "first"
    last = one_offs[-1][1] == "last"
    kept = steps[1 if first else 0: len(steps) - 1 if last else len(steps)]
    return win._replace(steps=kept, start=kept[0].start, end=kept[-1].end,
                        one_offs=tuple(one_offs))


def profiler_sync(
    cpu_ops: list[Event], host_end: float | None, runtime_sorted: list[Event]
) -> Event | None:
    """The device synchronize the profiler itself issues when it stops: after the last step
    (or, without steps, the last runtime call) and inside no operator of the program."""
    if not runtime_sorted:
        return None
    for ev in reversed(runtime_sorted):
        if ev.name not in DEVICE_SYNC_APIS:
            continue
        after_steps = host_end is not None and ev.ts >= host_end
        if not (after_steps or ev is runtime_sorted[-1]):
            continue
        end = ev.ts + ev.dur
        enclosed = any(
            op.tid == ev.tid and op.ts <= ev.ts and op.ts + op.dur >= end for op in cpu_ops
        )
        return None if enclosed else ev
    return None
