"""`gputop --auto-capture`: which raised findings start a capture by themselves.

Pure and clocked from outside, so the throttling is tested on a scripted clock. The app calls
``due`` with the active findings of each frame. A stall finding starts one capture per raise:
as soon as its process has an agent (at once, or later while the finding is still up, e.g. the
agent of a job that was still importing torch), unless that process was captured in the last
``min_interval`` seconds, in which case this raise is let go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable

from gputop.diagnostics.findings import finding_key

# Stalls a step-aligned trace can explain (the others, like throttling or memory, are
# visible from NVML alone).
STALL_IDS = frozenset({"dataloader-stall", "host-sync", "host-bound", "launch-bound", "gpu-idle",
                       "pcie-bound"})
MIN_INTERVAL_S = 600.0


class AutoCapturePolicy:
    def __init__(self, min_interval: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_interval = min_interval
        self.clock = clock
        self.last_capture: dict[int, float] = {}  # pid -> when its last capture started
        self._handled: set[tuple] = set()  # active findings already captured or let go

    def due(self, findings: Iterable, with_agent: Collection[int]) -> list:
        """The findings (at most one per pid) that should start a capture now; each is
        counted as captured at once, so a second call does not start it again."""
        now = self.clock()
        active = set()
        chosen = []
        for f in findings:
            key = finding_key(f)
            active.add(key)
            if key in self._handled or f.id not in STALL_IDS or f.pid is None:
                continue
            if f.pid not in with_agent:
                continue  # not yet: the agent may still come up while the finding is active
            self._handled.add(key)
            last = self.last_capture.get(f.pid)
            if last is not None and now - last < self.min_interval:
                continue
            self.last_capture[f.pid] = now
            chosen.append(f)
        self._handled &= active  # a finding that cleared may raise (and capture) again
        return chosen

    def record(self, pid: int) -> None:
        """A capture of ``pid`` started some other way (the `p` key): it counts too."""
        self.last_capture[pid] = self.clock()
