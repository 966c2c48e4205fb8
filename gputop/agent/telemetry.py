"""Continuous step telemetry, cheap enough to leave on in every run.

The training thread only appends a tuple per optimizer step and adds up where the step went:
the time spent in the DataLoader iterator's ``__next__``, and in the calls by which the host
waits on the device (``.item()``, ``.cpu()``, ``torch.cuda.synchronize()``; ``torch_hooks``).
Percentiles, rates and shares are computed on the server thread when someone asks for
``status``; so is the training thread's CPU time, read from ``/proc/self/task/TID/stat`` there
(nothing on the training thread: a CPU-time clock read is a system call), from which the share
of the time it ran its own code (Python, operator dispatch, kernel launches) outside the
DataLoader and the syncs follows (``host_busy_share``, over the time between two requests).
"""

from __future__ import annotations

import os
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
_CPU_MARKS = 64  # (time, thread CPU, waits) kept by status for host_busy_share
_BUSY_MIN_S = 0.5  # host_busy_share needs this much time between the requests it compares


def _nobody() -> None:
    return None


def thread_cpu_seconds(native_id: int) -> float | None:
    """CPU time (user + system) of this process's thread ``native_id``, from /proc (Linux);
    None when it cannot be read (another system, the thread gone)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
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
        self._sync = 0.0  # wait in device syncs since the last counted step
        # Every wait so far (DataLoader and syncs), for host_busy_share between two requests.
        self.total_waits = 0.0
        self.step_native_id: int | None = None  # the training thread's id in /proc
        self._cpu_marks: deque[tuple[float, float, float]] = deque(maxlen=_CPU_MARKS)
        self._marks_lock = threading.Lock()
        # (end time, step time, DataLoader wait, sync wait) of the last _RING steps.
        self._ring: deque[tuple[float, float, float, float]] = deque(maxlen=_RING)
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
                self.step_native_id = threading.get_native_id()
                if ledger is not None:
                    ledger.first_step(now)
            else:
                step_time = now - last
                self._ring.append((now, step_time, min(self._wait, step_time),
                                   min(self._sync, step_time)))
                if ledger is not None:  # before a capture starts or stops at this boundary
                    ledger.step(now, step_time, self._wait)
            self._wait = self._sync = 0.0
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
            self.total_waits += seconds

    def add_sync_wait(self, seconds: float) -> None:
        """Time one call took in which the training thread waited on the device."""
        if self.enabled and (self.step_thread is None or self.step_thread == threading.get_ident()):
            self._sync += seconds
            self.total_waits += seconds

    def record_error(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def reset(self) -> None:
        """Forget everything (a forked child starts its own history)."""
        self.steps = 0
        self.step_thread = None
        self.first_step_at = None
        self._last_step_at = None
        self._wait = self._sync = self.total_waits = 0.0
        self.step_native_id = None
        with self._marks_lock:
            self._cpu_marks.clear()
        self._ring.clear()
        self._leader = _nobody
        self._streak = 0
        self.on_step = None

    # --- any thread ----------------------------------------------------------------------------

    def leader(self) -> Any:
        """The optimizer whose steps are counted (None before the first step)."""
        return self._leader()

    def recent_steps(self, since: float) -> list[tuple[float, float, float]]:
        """(end time, step time, DataLoader wait) of the steps that ended after ``since``."""
        return [s[:3] for s in list(self._ring) if s[0] > since]

    def _host_busy_share(self, now: float) -> float | None:
        """The share of the time since an earlier request (at least _BUSY_MIN_S ago, at most
        _WINDOW_S) that the training thread spent on a CPU outside the DataLoader and the
        syncs: its CPU time less its waits (a DataLoader without workers and CUDA's spinning
        syncs use the CPU while they wait), over the time passed."""
        native = self.step_native_id
        cpu = thread_cpu_seconds(native) if native is not None else None
        if cpu is None:
            return None
        with self._marks_lock:
            marks = self._cpu_marks
            marks.append((now, cpu, self.total_waits))
            while marks and marks[0][0] < now - _WINDOW_S:
                marks.popleft()
            old = next((m for m in reversed(marks) if m[0] <= now - _BUSY_MIN_S), None)
        if old is None:
            return None
        span = now - old[0]
        busy = (cpu - old[1]) - (self.total_waits - old[2])
        return round(min(1.0, max(0.0, busy / span)), 4)

    def status(self) -> dict[str, Any]:
        """Step rate, step time p50/p95 and where the steps went over the last window: the
        shares of step time in the DataLoader (``dataloader_wait_share``) and in device syncs
        (``sync_wait_share``), and of the time on the thread's own code (``host_busy_share``,
        since an earlier request)."""
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
            "sync_wait_share": None,
            "host_busy_share": self._host_busy_share(now),
            "window_steps": len(window),
            "last_step_age_s": None if last is None else round(now - last, 3),
        }
        if window:
            times = sorted(s[1] for s in window)
            total = sum(times)
            p50 = _percentile(times, 0.50)
            result["step_time_p50_s"] = round(p50, 6)
            result["step_time_p95_s"] = round(_percentile(times, 0.95), 6)
            for key, column in (("dataloader_wait_share", 2), ("sync_wait_share", 3)):
                result[key] = (round(sum(s[column] for s in window) / total, 4)
                               if total > 0 else None)
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
