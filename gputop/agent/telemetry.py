"""Continuous step telemetry, cheap enough to leave on in every run.

The training thread only appends a tuple per optimizer step and adds up the time spent in the
DataLoader iterator's ``__next__``; percentiles and rates are computed on the server thread when
someone asks for ``status``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

# A step is counted on the "leader" optimizer. Another optimizer that steps this many times in
# a row while the leader does not takes over (the leader was replaced, or steps less often).
_LEADER_TAKEOVER = 4
_RING = 512  # steps kept for status percentiles
_WINDOW_S = 30.0  # status looks at steps that ended this recently


def _nobody() -> None:
    return None


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    index = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[index]


class StepTelemetry:
    """Step boundaries from the global optimizer post-hook, DataLoader wait around ``__next__``."""

    def __init__(self) -> None:
        self.enabled = True  # False in forked children until they step an optimizer themselves
        self.steps = 0
        self.errors = 0
        self.last_error: str | None = None
        self.step_thread: int | None = None
        self.first_step_at: float | None = None  # perf_counter of the first counted step
        self._last_step_at: float | None = None
        self._wait = 0.0  # DataLoader wait since the last counted step (training thread only)
        self._ring: deque[tuple[float, float, float]] = deque(maxlen=_RING)
        # The optimizer whose steps we count (a weak reference: id() values get reused).
        self._leader: Callable[[], Any] = _nobody
        self._streak = 0
        # Called on the training thread at each counted step, with perf_counter(); set while a
        # capture is pending so that the idle path is one attribute test.
        self.on_step: Callable[[float], None] | None = None
        # Called at the first optimizer step of a process where the agent is dormant.
        self.on_first_step: Callable[[], None] | None = None
        # Where the process's time goes (gputop.agent.goodput.GoodputLedger), set by the agent.
        self.ledger: Any = None
        # The FLOP count's step boundary, set only while one is pending (like on_step).
        self.on_boundary: Callable[[float], None] | None = None

    # --- training thread ---------------------------------------------------------------------

    def optimizer_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global optimizer step post-hook. Never raises into the training loop."""
        if not self.enabled:
            wake = self.on_first_step
            if wake is None:
                return
            # A dormant multiprocessing child steps an optimizer: it trains, so it may serve.
            self.on_first_step = None
            try:
                wake()
            except Exception as exc:
                self.record_error(exc)
            if not self.enabled:
                return
        try:
            leader = self._leader()
            if optimizer is not leader:
                if leader is not None:
                    self._streak += 1
                    if self._streak < _LEADER_TAKEOVER:
                        return
                # No leader yet, the old one was freed (replaced), or it stopped stepping.
                try:
                    self._leader = weakref.ref(optimizer)
                except TypeError:
                    self._leader = lambda: optimizer  # not weak-referenceable: keep it
            self._streak = 0
            now = time.perf_counter()
            last = self._last_step_at
            self._last_step_at = now
            self.steps += 1
            ledger = self.ledger
            if last is None:
                self.first_step_at = now
                self.step_thread = threading.get_ident()
                if ledger is not None:
                    ledger.first_step(now)
            else:
                step_time = now - last
                self._ring.append((now, step_time, min(self._wait, step_time)))
                if ledger is not None:  # before a capture starts or stops at this boundary
                    ledger.step(now, step_time, self._wait)
            self._wait = 0.0
            on_step = self.on_step
            if on_step is not None:
                on_step(now)
            on_boundary = self.on_boundary
            if on_boundary is not None:
                on_boundary(now)
        except Exception as exc:  # the agent must never break the training loop
            self.record_error(exc)

    def add_dataloader_wait(self, seconds: float) -> None:
        """Time one ``__next__`` of a DataLoader iterator took, on whichever thread ran it."""
        if self.enabled and (self.step_thread is None or self.step_thread == threading.get_ident()):
            self._wait += seconds

    def record_error(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def reset(self) -> None:
        """Forget everything (a forked child starts its own history)."""
        self.steps = 0
        self.step_thread = None
        self.first_step_at = None
        self._last_step_at = None
        self._wait = 0.0
        self._ring.clear()
        self._leader = _nobody
        self._streak = 0
        self.on_step = None

    # --- any thread ----------------------------------------------------------------------------

    def recent_steps(self, since: float) -> list[tuple[float, float, float]]:
        """(end time, step time, DataLoader wait) of the steps that ended after ``since``."""
        return [s for s in list(self._ring) if s[0] > since]

    def status(self) -> dict[str, Any]:
        """Step rate, step time p50/p95 and DataLoader-wait share over the last window."""
        now = time.perf_counter()
        ring = list(self._ring)  # one C-level copy; the training thread may append meanwhile
        steps = self.steps
        last = self._last_step_at
        window = [s for s in ring if s[0] > now - _WINDOW_S]
        if len(window) < 2:
            window = ring[-20:]  # slow steps: still describe the most recent ones
        result: dict[str, Any] = {
            "steps": steps,
            "steps_per_s": None,
            "step_time_p50_s": None,
            "step_time_p95_s": None,
            "dataloader_wait_share": None,
            "window_steps": len(window),
            "last_step_age_s": None if last is None else round(now - last, 3),
        }
        if window:
            times = sorted(s[1] for s in window)
            total = sum(times)
            p50 = _percentile(times, 0.50)
            result["step_time_p50_s"] = round(p50, 6)
            result["step_time_p95_s"] = round(_percentile(times, 0.95), 6)
            result["dataloader_wait_share"] = (
                round(sum(s[2] for s in window) / total, 4) if total > 0 else None
            )
            # Steps slower than the window still get a rate: widen it to two steps.
            span = min(max(_WINDOW_S, 2 * p50), now - (self.first_step_at or now))
            count = sum(1 for s in ring if s[0] > now - span)
            if len(ring) == _RING and ring[0][0] > now - span:
                # The ring holds fewer seconds than the span (a fast job: 512 steps are 4 s at
                # 120 steps/s): rate over the time the ring covers, after its oldest step.
                span, count = now - ring[0][0], len(ring) - 1
            if span > 0:
                result["steps_per_s"] = round(count / span, 4)
        elif last is not None:
            result["steps_per_s"] = 0.0
        return result
