"""What the device's busy time is: compute, copies by direction, memsets, communication.

The idle time has its causes (``measuring/gaps.py``); this accounts for the rest. Per class, over the
judged window: the time the device ran at least one activity of the class (a union, so
concurrent kernels count once), its share of the window, and for copies the bytes moved and the
rate achieved, against the GPU's host link (``measuring/links.py``) for host-device copies.

Classes overlap: a copy engine moves data while the SMs compute, so the shares may add up to
more than the busy share. ``exposed_ms`` of a copy class is its time with no kernel (compute or
communication) running beside it: what the step would lose if the copies went away, and what
the ``copy-bound`` finding costs.

Kineto names a copy by its direction and the host memory involved: ``Memcpy HtoD (Pinned ->
Device)``, ``Memcpy DtoH (Device -> Pageable)``, ``Memcpy DtoD (Device -> Device)``, ``Memcpy
PtoP (Device -> Device)`` (between GPUs); ROCm writes ``(Host -> Device)``.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from gputop.core.format import ms_h
from gputop.diagnostics.trace.measuring.gaps import Activity, Attribution
from gputop.diagnostics.trace.measuring.intervals import (
    RangeIndex,
    Ranges,
    intersect,
    merge,
    subtract,
    total,
)
from gputop.diagnostics.trace.measuring.links import Link
from gputop.diagnostics.trace.measuring.stats import pct, r3

COPY_CLASSES = ("h2d", "d2h", "d2d", "p2p")
BUSY_CLASSES = ("compute", "communication", *COPY_CLASSES, "memset")
# Host-device copies: the ones that cross the host link.
HOST_COPIES = ("h2d", "d2h")
_DIRECTIONS = (("HtoD", "h2d"), ("DtoH", "d2h"), ("DtoD", "d2d"), ("PtoP", "p2p"))


@lru_cache(maxsize=256)
def copy_class(name: str) -> str:
    """``h2d``, ``d2h``, ``d2d``, ``p2p`` from a Kineto copy name, else ``other_copy``."""
    for key, cls in _DIRECTIONS:
        if key in name:
            return cls
    return "other_copy"


@lru_cache(maxsize=256)
def host_memory(name: str) -> str | None:
    """``pinned`` or ``pageable`` host memory of a host-device copy, when the name says."""
    if "Pageable" in name:
        return "pageable"
    if "Pinned" in name:
        return "pinned"
    return None


def busy_breakdown(att: Attribution, moves: list[Activity], slots: Ranges, devices: list[int],
                   window_ms: float, gpu: bool, link: Link | None,
                   busy_by_dev: dict[int, float]) -> dict:
    """The ``busy`` section of the metrics (see the module docstring). ``moves``: the copies and
    memsets (kernels are read from the attribution's unions). Times are averaged over
    ``devices`` like the step breakdown; bytes and counts are summed over them.
    ``busy_by_dev``: each device's busy time inside the window (us)."""
    n = max(1, len(devices))
    wanted = set(devices)
    slot_index = RangeIndex(slots)
    spans: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    moved: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    pinned: dict[str, float] = defaultdict(float)
    pageable: dict[str, float] = defaultdict(float)
    w0, w1 = (slots[0][0], slots[0][1]) if len(slots) == 1 else (0.0, 0.0)
    for a in moves:
        if a.device not in wanted:
            continue
        cls = "memset" if a.kind == "memset" else copy_class(a.name)
        if a.end <= a.ts:
            share = 1.0 if slot_index.covering(a.ts) else 0.0
        elif len(slots) == 1:  # steps back to back: one range, no index needed
            share = max(0.0, min(a.end, w1) - max(a.ts, w0)) / (a.end - a.ts)
        else:
            share = slot_index.covered(a.ts, a.end) / (a.end - a.ts)
        if share <= 0:
            continue
        count[cls] += 1
        moved[cls] += a.nbytes * share
        memory = host_memory(a.name)
        if memory == "pinned":
            pinned[cls] += a.nbytes * share
        elif memory == "pageable":
            pageable[cls] += a.nbytes * share
        spans[cls][a.device].append((a.ts, a.end))

    def exposed(copies: Ranges, dev: int) -> Ranges:
        """Copy time with no kernel beside it (the kinds' unions are sorted and disjoint)."""
        for kind in ("compute", "comm"):
            kernels = att.kinds.get(dev, {}).get(kind)
            if kernels and copies:
                copies = subtract(copies, kernels)
        return copies

    classes: dict[str, dict] = {}
    host_copies_exposed = 0.0
    for cls in (*BUSY_CLASSES, "other_copy"):
        if not gpu and cls not in ("compute", "communication"):
            continue
        if cls == "other_copy" and not count.get(cls):
            continue
        us = exposed_us = 0.0
        for dev in devices:
            if cls in ("compute", "communication"):
                mine = intersect(att.kinds.get(dev, {}).get("comm" if cls == "communication"
                                                             else "compute", []), slots)
            else:
                mine = intersect(merge(spans[cls].get(dev, [])), slots)
            us += total(mine)
            if cls in COPY_CLASSES and mine:
                exposed_us += total(exposed(mine, dev))
        ms = us / 1e3 / n
        row: dict = {"ms": r3(ms), "pct": pct(ms, window_ms)}
        if cls not in ("compute", "communication"):
            row["count"] = count.get(cls, 0)
            row["bytes"] = int(round(moved.get(cls, 0.0)))
        if cls in (*COPY_CLASSES, "other_copy"):
            row["gb_per_s"] = r3(moved[cls] / (us * 1e3), 2) if us > 0 else None
            row["exposed_ms"] = r3(exposed_us / 1e3 / n)
            row["exposed_pct"] = pct(exposed_us / 1e3 / n, window_ms)
        if cls in HOST_COPIES:
            known = pinned.get(cls, 0.0) + pageable.get(cls, 0.0)
            row["pinned_pct"] = pct(pinned.get(cls, 0.0), known) if known else None
            row["link_pct"] = (pct(row["gb_per_s"], link.gb_per_s)
                               if link is not None and row["gb_per_s"] else None)
        classes[cls] = row
    for dev in devices:  # host copies of both directions at once count once
        both = intersect(merge([*spans["h2d"].get(dev, []), *spans["d2h"].get(dev, [])]), slots)
        host_copies_exposed += total(exposed(both, dev))
    busy_ms = sum(busy_by_dev.get(dev, 0.0) for dev in devices) / 1e3 / n
    return {
        "window_ms": r3(window_ms),
        "busy_ms": r3(busy_ms),
        "busy_pct": pct(busy_ms, window_ms),
        "classes": classes,
        "host_copies_exposed_ms": r3(host_copies_exposed / 1e3 / n),
        "host_copies_exposed_pct": pct(host_copies_exposed / 1e3 / n, window_ms),
        "link": (
            {"name": link.name, "gb_per_s": link.gb_per_s, "basis": link.basis}
            if link is not None and gpu else None
        ),
        "devices": list(devices),
    }


CLASS_LABELS = {"compute": "compute", "communication": "communication", "h2d": "H2D copies",
                "d2h": "D2H copies", "d2d": "D2D copies", "p2p": "P2P copies",
                "memset": "memsets", "other_copy": "other copies"}


def size_text(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}" if unit == "GiB" else f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def copy_text(cls: str, row: dict, link: dict | None) -> str:
    """"H2D copies 3.00 GiB in 57.0 ms at 56.5 GB/s (90% of the PCIe Gen5 x16 link's 63.0 GB/s
    per direction)"; the link only for host-device copies."""
    text = f"{CLASS_LABELS[cls]} {size_text(row['bytes'])} in {ms_h(row['ms'])}"
    if row.get("gb_per_s"):
        text += f" at {row['gb_per_s']:.1f} GB/s"
        if cls in HOST_COPIES and link is not None and row.get("link_pct") is not None:
            text += (f" ({row['link_pct']:.0f}% of the {link['name']} link's "
                     f"{link['gb_per_s']:.1f} GB/s per direction)")
    return text
