"""What a memory capture found, from its allocation events (``memory_events``): pure, standard
library only, so the same arithmetic serves the CPU and the CUDA route and the tests.

The window is the steps the agent recorded, between optimizer-step boundaries ``marks``:
``marks[0]`` starts a warm-up step, ``marks[1]`` ends it, each later mark ends a recorded step.

* **Growth**: for each source line, the bytes of its allocations made during the window and
  still alive at a boundary. What the line holds after the warm-up step is its steady state
  (gradients re-made every step, the optimizer's buffers); what it holds at the last boundary
  beyond that is growth, ``/ steps`` per step. A leak shows as a line whose bytes rise at every
  boundary.
* **The peak** of the recorded step whose allocations reach highest, and what was alive there:
  parameters, gradients and optimizer state (their storages, measured from the optimizer the
  agent's step hook sees), activations (made during that step, alive at its peak and freed
  before it ended, none of the above: what the forward pass saves for the backward pass, and
  the step's temporaries), and other (everything else alive: what earlier steps kept, what the
  step made and kept, and with the CUDA allocator's count of what was allocated before the
  window, the rest of the process's memory on the device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_LINES = 16  # growth lines and peak lines in a report
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")

Event = tuple[int, int, int, int]  # (time_ns, addr, size, site); size < 0: a free


@dataclass
class Storages:
    """The storages (address, bytes) of the model's tensors on the captured device, at the
    last boundary, by what they are."""

    parameters: dict[int, int] = field(default_factory=dict)
    gradients: dict[int, int] = field(default_factory=dict)
    optimizer_state: dict[int, int] = field(default_factory=dict)

    def category(self, addr: int) -> str | None:
        for name in ("parameters", "gradients", "optimizer_state"):
            if addr in getattr(self, name):
                return name
        return None

    def totals(self) -> dict[str, int]:
        return {name: sum(getattr(self, name).values())
                for name in ("parameters", "gradients", "optimizer_state")}


@dataclass
class _Live:
    size: int
    site: int
    t: int
    index: int  # the allocation's position in the events


def _alive_by_site(live: dict[int, _Live]) -> dict[int, int]:
    out: dict[int, int] = {}
    for a in live.values():
        out[a.site] = out.get(a.site, 0) + a.size
    return out


def growth(events: Sequence[Event], marks: Sequence[int]) -> tuple[list[dict[str, Any]], dict]:
    """Lines whose allocations of the window alive at the last boundary exceed what they held
    after the warm-up step, largest first, and the address of each line's newest such
    allocation (to look for what keeps it)."""
    live: dict[int, _Live] = {}
    at_marks: list[dict[int, int]] = []
    boundaries = list(marks[1:])
    b = 0
    for index, (t, addr, size, site) in enumerate(events):
        while b < len(boundaries) and t > boundaries[b]:
            at_marks.append(_alive_by_site(live))
            b += 1
        if size > 0:
            live[addr] = _Live(size, site, t, index)
        else:
            live.pop(addr, None)
    while b < len(boundaries):
        at_marks.append(_alive_by_site(live))
        b += 1
    if len(at_marks) < 2:
        return [], {}
    steps = len(at_marks) - 1
    first, last = at_marks[0], at_marks[-1]
    newest: dict[int, tuple[int, int]] = {}  # site -> (time, addr) of its newest live alloc
    counts: dict[int, int] = {}
    after = boundaries[0]
    for addr, a in live.items():
        if a.t > after and a.t <= boundaries[-1]:
            counts[a.site] = counts.get(a.site, 0) + 1
            if a.t > newest.get(a.site, (0, 0))[0]:
                newest[a.site] = (a.t, addr)
    lines = []
    for site, held in last.items():
        grown = held - first.get(site, 0)
        if grown <= 0:
            continue
        series = [m.get(site, 0) for m in at_marks]
        lines.append({
            "site": site,
            "bytes": grown,
            "bytes_per_step": grown // steps,
            "count": counts.get(site, 0),
            "alive_per_step": series,
            # Rose at every boundary: a leak's signature (a one-off keeps one level).
            "steady": all(b2 > b1 for b1, b2 in zip(series, series[1:])),
        })
    lines.sort(key=lambda x: -x["bytes"])
    lines = lines[:MAX_LINES]
    return lines, {x["site"]: newest[x["site"]][1] for x in lines if x["site"] in newest}


def _peak_step(events: Sequence[Event], marks: Sequence[int], baseline: int
               ) -> tuple[int, int, int] | None:
    """(step number from 1, index of the event at the peak, bytes then) of the recorded step
    whose allocations reached highest; the count starts at ``baseline``."""
    total = baseline
    best: tuple[int, int, int] | None = None
    step = 0  # 0: the warm-up step
    for index, (t, _addr, size, _site) in enumerate(events):
        while step + 1 < len(marks) and t > marks[step + 1]:
            step += 1
        total += size
        if step >= 1 and step < len(marks) - 1 and (best is None or total > best[2]):
            best = (step, index, total)
    return best


def peak(events: Sequence[Event], marks: Sequence[int], storages: Storages,
         baseline: int | None) -> dict[str, Any] | None:
    """The peak's composition (see the module's docstring). ``baseline``: what the allocator
    counted as allocated at ``marks[0]`` (CUDA), None where that is unknown (CPU: the parts
    made before the window that are not the model's own storages are not seen)."""
    found = _peak_step(events, marks, baseline or 0)
    if found is None:
        return None
    step, at, total = found
    step_start, step_end = marks[step], marks[step + 1]
    live: dict[int, _Live] = {}
    freed_later: set[int] = set()  # allocations (their index) freed after the peak
    freed_in_step: set[int] = set()  # ... and of those, freed before the step ended
    for index, (t, addr, size, site) in enumerate(events):
        if size > 0:
            if index <= at:
                live[addr] = _Live(size, site, t, index)
        elif index <= at:
            live.pop(addr, None)
        elif addr in live and live[addr].index not in freed_later:
            freed_later.add(live[addr].index)
            if t <= step_end:
                freed_in_step.add(live[addr].index)
    # Storages made before the window were alive all through it.
    made_in_window = {addr for (_t, addr, size, _s) in events if size > 0}
    parts = dict.fromkeys(CATEGORIES, 0)
    for name, sizes in (("parameters", storages.parameters), ("gradients", storages.gradients),
                        ("optimizer_state", storages.optimizer_state)):
        parts[name] += sum(n for addr, n in sizes.items() if addr not in made_in_window)
    by_site: dict[int, int] = {}
    for addr, a in live.items():
        kind = storages.category(addr) if a.index not in freed_later else None
        if kind is None:
            kind = ("activations" if a.t > step_start and a.index in freed_in_step
                    else "other")
        parts[kind] += a.size
        if kind == "activations":
            by_site[a.site] = by_site.get(a.site, 0) + a.size
    if baseline is not None:
        # What the allocator counted at the peak, less what is named: memory of the process
        # from before the window (buffers, caches, other models) on this device.
        parts["other"] += max(0, total - sum(parts.values()))
    top = sorted(by_site.items(), key=lambda kv: -kv[1])[:MAX_LINES]
    return {
        "step": step,
        "bytes": total if baseline is not None else sum(parts.values()),
        "absolute": baseline is not None,
        "time_ns": events[at][0],
        "parts": parts,
        "activation_lines": [{"site": s, "bytes": n} for s, n in top],
    }


def reserved_at(deltas: Sequence[tuple[int, int]], reserved_start: int, t: int) -> int:
    """The allocator's reserved bytes at ``t`` from the segments it took and gave back."""
    return reserved_start + sum(d for (when, d) in deltas if when <= t)
