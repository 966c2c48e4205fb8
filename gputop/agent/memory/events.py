"""The allocations of a memory capture as plain events, from either of PyTorch's instruments.

Both give an event per allocation and per free with its address, its size and the Python
stack that made it; this module turns each into ``(time_ns, addr, size, site)`` tuples (``size``
negative for a free) and a table of source lines (``Sites``), so one summary reads both:

* on CUDA, the caching allocator's history (``torch.cuda.memory._record_memory_history``): its
  ``_snapshot()`` lists the trace entries (``alloc``, ``free_requested``, ``segment_alloc``...)
  with epoch-microsecond times and, for allocations, the Python frames, innermost first;
* without CUDA, the profiler's memory events (``profile_memory=True``) placed in the profiler's
  event tree, where every allocation sits under the operator that made it, and that operator
  under an annotation naming the user's line that called it (``memory_sites``).

The line an allocation is charged to is the innermost frame in the user's own code (outside
the standard library, site-packages and gputop), as the README's "where" lines are: the line
that allocates a tensor in a library call is the user's call of that library.

Training process side: standard library only; torch is never imported here (the objects come
in from ``agent.memory``). Walking the event tree runs on the agent's analysis thread, bounded
by a time budget.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

MAX_CODE = 200  # characters of a source line kept in the report


class Site(NamedTuple):
    file: str  # absolute when it could be found on sys.path
    line: int
    function: str


class Sites:
    """Source lines, each given an index once (events carry the index)."""

    def __init__(self) -> None:
        self.index: dict[Site, int] = {}
        self.sites: list[Site] = []

    def add(self, site: Site) -> int:
        found = self.index.get(site)
        if found is None:
            found = self.index[site] = len(self.sites)
            self.sites.append(site)
        return found

    def code(self, number: int) -> str:
        """The text of the line (the job's own file, read here), stripped and bounded."""
        site = self.sites[number]
        try:
            text = linecache.getline(site.file, site.line).strip()
        except Exception:
            return ""
        return text[:MAX_CODE]


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    gputop_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tuple(sorted(r + os.sep for r in roots | {gputop_root} if r))


_LIBRARY_ROOTS = _library_roots()
_resolved: dict[str, str] = {}


def resolve(file: str) -> str:
    """The absolute path of a file the profiler names relative to the sys.path entry it was
    found under (``torch/nn/modules/linear.py``, ``train.py``); as given when not found."""
    found = _resolved.get(file)
    if found is not None:
        return found
    path = file
    if file and not os.path.isabs(file) and not file.startswith("<"):
        for entry in [os.getcwd(), *sys.path]:
            candidate = os.path.join(entry or os.getcwd(), file)
            if os.path.isfile(candidate):
                path = os.path.abspath(candidate)
                break
    if len(_resolved) < 65536:
        _resolved[file] = path
    return path


def is_library(path: str) -> bool:
    """Code that is not the user's: the standard library, installed packages, gputop itself,
    frozen or built-in modules."""
    if not path or path.startswith("<"):
        return True
    if "/site-packages/" in path or "/dist-packages/" in path:
        return True
    return path.startswith(_LIBRARY_ROOTS)


def user_site(frames: Iterable[tuple[str, int, str]]) -> Site | None:
    """The innermost user frame of ``frames`` (innermost first: (file, line, function))."""
    for file, line, function in frames:
        path = resolve(file)
        if not is_library(path):
            return Site(path, int(line), function)
    return None


# --- the profiler (no CUDA) -----------------------------------------------------------------


class Walked(NamedTuple):
    events: list[tuple[int, int, int, int]]  # (time_ns, addr, size, site index or -1)
    complete: bool  # False: the time budget ran out before the whole tree was read


def profiler_events(result: Any, device: str, budget_s: float, event_types: Any,
                    prefix: str) -> Walked:
    """Allocation events for ``device`` (``"cpu"``) from a stopped profiler's results
    (``prof.profiler.kineto_results``), each charged to the source line of the innermost
    annotation above it named ``<prefix><site index>`` (``memory_sites``)."""
    deadline = time.monotonic() + budget_s
    allocation = event_types.Allocation
    out: list[tuple[int, int, int, int]] = []
    # (event, the site of the innermost annotation above it)
    stack: list[tuple[Any, int]] = [(root, -1) for root in reversed(
        result.experimental_event_tree())]
    seen = 0
    while stack:
        event, site = stack.pop()
        seen += 1
        if seen & 4095 == 0 and time.monotonic() > deadline:
            return Walked(sorted(out), False)
        if event.tag == allocation:
            fields = event.extra_fields
            if str(fields.device) == device and fields.alloc_size:
                out.append((event.start_time_ns, int(fields.ptr), int(fields.alloc_size), site))
            continue
        name = event.name
        if name.startswith(prefix):
            try:
                site = int(name[len(prefix):])
            except ValueError:
                pass
        children = event.children
        if children:
            stack.extend((child, site) for child in reversed(children))
    return Walked(sorted(out), True)


# --- the CUDA caching allocator's history ---------------------------------------------------


class AllocatorTrace(NamedTuple):
    events: list[tuple[int, int, int, int]]
    reserved_deltas: list[tuple[int, int]]  # (time_ns, +/- bytes): segment_alloc / _free
    first_entry_ns: int | None  # the oldest entry the ring buffer still held
    entries: int


def snapshot_frames(frames: Any) -> list[tuple[str, int, str]]:
    """A snapshot's frames (``{"filename", "line", "name"}``), innermost first as the allocator
    records them; turned round should the outermost (``<module>``) come first."""
    out = [(str(f.get("filename", "")), int(f.get("line") or 0), str(f.get("name", "")))
           for f in frames or () if isinstance(f, dict)]
    if len(out) > 1 and out[0][2] == "<module>" and out[-1][2] != "<module>":
        out.reverse()
    return out


def allocator_events(trace: list[dict[str, Any]], sites: Sites, since_ns: int,
                     until_ns: int) -> AllocatorTrace:
    """The entries of one device's trace between ``since_ns`` and ``until_ns`` as events.
    A free is the program's (``free_requested``); ``free_completed`` counts only for an
    address whose request was not seen (its entry left the ring buffer)."""
    events: list[tuple[int, int, int, int]] = []
    reserved: list[tuple[int, int]] = []
    requested: set[int] = set()
    first = None
    for entry in trace:
        t = int(entry.get("time_us") or 0) * 1000
        if first is None or t < first:
            first = t
        if not since_ns <= t <= until_ns:
            continue
        action = entry.get("action")
        addr = int(entry.get("addr") or 0)
        size = int(entry.get("size") or 0)
        if action == "alloc":
            found = user_site(snapshot_frames(entry.get("frames")))
            events.append((t, addr, size, sites.add(found) if found is not None else -1))
            requested.discard(addr)
        elif action == "free_requested":
            events.append((t, addr, -size, -1))
            requested.add(addr)
        elif action == "free_completed":
            if addr in requested:
                requested.discard(addr)
            else:
                events.append((t, addr, -size, -1))
        elif action == "segment_alloc":
            reserved.append((t, size))
        elif action == "segment_free":
            reserved.append((t, -size))
    events.sort()
    return AllocatorTrace(events, reserved, first, len(trace))
