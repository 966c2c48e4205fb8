"""Where a training process's wall time goes: the goodput ledger, kept on the training thread.

Every second since the process started lands in one bucket:

* ``startup``: from the process's start to the end of its first optimizer step (imports, model
  build, CUDA context, the first step's warm-up);
* ``dataloader``: time inside ``DataLoader.__next__`` within a step;
* ``checkpoint``: time inside ``torch.save`` within a step, and the excess of a long step in
  which the training thread wrote at least ``CHECKPOINT_BYTES`` to files (the kernel's per-thread
  write accounting, ``getrusage(RUSAGE_THREAD).ru_oublock``, against a baseline read every
  ``BASELINE_STEPS`` steps: ``safetensors``, ``np.save``, ``torch.distributed.checkpoint``
  writing on this thread);
* ``capture``: steps that ran under a profiler capture or the agent's FLOP count (instrumented
  steps are slower and are not the job's own pace);
* ``stall``: the excess over the typical step of a long step (``LONG_STEP`` times the typical
  one, and ``LONG_STEP_MIN_S`` longer) that none of the above explains: a slow collective, a straggler, an evaluation pass;
* ``hang``: the same, for a step longer than ``HANG_S`` (the live ``hung`` rule's window), and
  the time since the last step once it is that long;
* ``productive``: the rest. Goodput is productive time over the time accounted for.

The typical step is an exponential average (``ALPHA``) of the steps that were not long; when
``REGIME_STEPS`` long steps come in a row, the job's pace has changed (a new phase, a larger
batch): those steps are booked as productive after all and become the new typical.

The training thread pays one call per step (see benchmarks/bench_agent.py); the server thread
reads the totals. Floats are written by one thread and read by another: a status may be one
step behind, never torn.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

LONG_STEP = 3.0  # a step this many times the typical one is long...
# ...and longer than it by this much: below the kernel's scheduling period (4 ms at HZ=250, CFS
# slices of a few ms) a slower step is the machine's jitter, not the job's.
LONG_STEP_MIN_S = 0.01
HANG_S = 60.0  # gputop.diagnostics.live.HUNG_S: a step (or a wait) this long is a hang
ALPHA = 0.1  # weight of a new step in the typical step time
REGIME_STEPS = 8  # long steps in a row that make the new normal
CHECKPOINT_BYTES = 1 << 20  # a long step that wrote this much to files was a checkpoint
BEST_WINDOW_S = 30.0  # the window of the job's best step rate (the agent's status window)
# The blocks the training thread wrote are read once every BASELINE_STEPS ordinary steps and at
# each long step: what a long step wrote is what was written since (a few ordinary steps' logs
# are bytes, a checkpoint megabytes), at a fraction of a getrusage per step.
BASELINE_STEPS = 16
_PROFILED = ("warmup", "recording", "cancelling")  # a capture's states with the profiler on

_BLOCK = 512  # ru_oublock counts 512-byte blocks
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux


def process_start_perf() -> float:
    """When this process started, on the ``time.perf_counter`` scale (Linux /proc; else now)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        start_ticks = int(stat[stat.rindex(b")") + 2:].split()[19])
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        age = 0.0
    return time.perf_counter() - max(0.0, age)


def _written_blocks() -> int:
    """Blocks this thread has written to files (the kernel charges a write when it dirties
    the page cache, to the thread that wrote)."""
    if _RUSAGE_THREAD is None:
        return 0
    return resource.getrusage(_RUSAGE_THREAD).ru_oublock


def wrap_torch_save(torch: Any, ledger_of: Callable[[], Any],
                    step_thread: Callable[[], int | None]) -> Callable[[], None]:
    """Time ``torch.save`` on the training thread into the ledger; returns the undo.

    ``ledger_of`` and ``step_thread`` are read at each call (a save on another thread, an
    asynchronous checkpointer, does not hold up the steps)."""
    original = getattr(torch, "save", None)
    if original is None or getattr(original, "_gputop_original", None) is not None:
        return lambda: None
    perf_counter = time.perf_counter

    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        t0 = perf_counter()
        blocks = _written_blocks()
        try:
            return original(*args, **kwargs)
        finally:
            try:
                ledger = ledger_of()
                if ledger is not None and step_thread() == threading.get_ident():
                    ledger.add_checkpoint(perf_counter() - t0, _written_blocks() - blocks)
            except Exception:
                pass  # never mask the save's own result or error

    save._gputop_original = original  # type: ignore[attr-defined]
    torch.save = save

    def undo() -> None:
        if getattr(torch, "save", None) is save:
            torch.save = original

    return undo


class _NoCapture:
    job = None


class GoodputLedger:
    """Seconds per category since the process started (see the module's docstring)."""

    def __init__(self, started: float | None = None, capture: Any = None) -> None:
        self.started = process_start_perf() if started is None else started
        # The CaptureController (its ``job`` while one is pending), or a stand-in without one.
        self.capture = capture if capture is not None else _NoCapture()
        self.counting = False  # the FLOP count instruments the current step
        # The categories as plain attributes: the step hook adds to them (a dict costs more).
        self.productive = self.startup = self.dataloader = self.capture_s = 0.0
        self.checkpoint = self.stall = self.hang = 0.0
        self.first_step_at: float | None = None
        self.last_step_at: float | None = None
        self.typical: float | None = None
        self._streak = 0  # long (stall) steps in a row
        self._streak_s = 0.0  # their excess, booked as stall for now
        self._checkpoint = 0.0  # torch.save time since the last step (training thread)
        self._blocks = 0  # the thread's written blocks at the last baseline
        self._since_baseline = 0
        self._window_start = math.inf  # set at the first step
        self._window_steps = 0
        self.best_rate: float | None = None  # steps/s of the best BEST_WINDOW_S window
        self.best_at: float | None = None

    @property
    def seconds(self) -> dict[str, float]:
        return {"productive": self.productive, "startup": self.startup,
                "dataloader": self.dataloader, "capture": self.capture_s,
                "checkpoint": self.checkpoint, "stall": self.stall, "hang": self.hang}

    # --- training thread ---------------------------------------------------------------------

    def first_step(self, now: float) -> None:
        self.startup = max(0.0, now - self.started)
        self.first_step_at = self.last_step_at = now
        self._window_start, self._window_steps = now, 0
        self._blocks = _written_blocks()

    def add_checkpoint(self, seconds: float, blocks: int = 0) -> None:
        """Time one ``torch.save`` took on the training thread, and the blocks it wrote (they
        are its own, not a sign that the rest of the step wrote a checkpoint)."""
        self._checkpoint += seconds
        self._blocks += blocks

    def step(self, now: float, step_time: float, wait: float) -> None:
        """One optimizer step ended at ``now`` after ``step_time``, ``wait`` of it in the
        DataLoader. Called from the step hook, before a capture's own step callback."""
        self.last_step_at = now
        # The job's best window of step rate (the mfu-drop rule's "its own best").
        self._window_steps += 1
        span = now - self._window_start
        if span >= BEST_WINDOW_S:
            rate = self._window_steps / span
            if self.best_rate is None or rate > self.best_rate:
                self.best_rate, self.best_at = rate, now
            self._window_start, self._window_steps = now, 0
        if wait > step_time:
            wait = step_time
        rest = step_time - wait
        saved = self._checkpoint
        if saved:
            saved = min(saved, rest)
            self._checkpoint = 0.0
            rest -= saved
            self.checkpoint += saved
        self.dataloader += wait
        job = self.capture.job
        if self.counting or (job is not None and job.state in _PROFILED):
            self.capture_s += rest
            return
        typical = self.typical
        if typical is None:
            self.typical = rest
            self.productive += rest
            return
        if rest <= LONG_STEP * typical or rest - typical < LONG_STEP_MIN_S:
            self.productive += rest
            self.typical = typical + ALPHA * (rest - typical)
            self._streak = 0
            self._streak_s = 0.0
            self._since_baseline += 1
            if self._since_baseline >= BASELINE_STEPS:
                self._blocks = _written_blocks()
                self._since_baseline = 0
            return
        self._long_step(step_time, rest - typical)

    def _long_step(self, step_time: float, excess: float) -> None:
        blocks = _written_blocks()
        wrote = (blocks - self._blocks) * _BLOCK
        self._blocks, self._since_baseline = blocks, 0
        self.productive += self.typical or 0.0
        if wrote >= CHECKPOINT_BYTES:
            self.checkpoint += excess
        elif step_time >= HANG_S:
            self.hang += excess
        else:
            self.stall += excess
            self._streak += 1
            self._streak_s += excess
            if self._streak >= REGIME_STEPS:
                # Not stalls: the pace changed. Book them as work and follow the new pace.
                self.stall -= self._streak_s
                self.productive += self._streak_s
                self.typical = (self.typical or 0.0) + excess
                self._streak, self._streak_s = 0, 0.0

    # --- any thread ----------------------------------------------------------------------------

    def status(self, now: float | None = None) -> dict[str, Any]:
        """The totals in seconds, the time not yet booked (the step in progress), and goodput:
        productive time over the time booked (a wait longer than HANG_S counts as a hang)."""
        now = time.perf_counter() if now is None else now
        seconds = self.seconds
        last = self.last_step_at
        if last is None:
            seconds["startup"] = max(0.0, now - self.started)  # no step yet: all start-up
            open_s = 0.0
        else:
            open_s = max(0.0, now - last)
            if open_s >= HANG_S:
                seconds["hang"] += open_s - (self.typical or 0.0)
                open_s = self.typical or 0.0
        booked = sum(seconds.values())
        result: dict[str, Any] = {
            "seconds": {k: round(max(0.0, v), 3) for k, v in seconds.items()},
            "in_step_s": round(open_s, 3),
            "wall_s": round(max(0.0, now - self.started), 3),
            "goodput": round(seconds["productive"] / booked, 4) if booked > 0 else None,
            "typical_step_s": None if self.typical is None else round(self.typical, 6),
            "best_window_steps_per_s": None if self.best_rate is None
            else round(self.best_rate, 4),
            "best_window_s": BEST_WINDOW_S,
            "best_window_age_s": None if self.best_at is None else round(now - self.best_at, 1),
        }
        return result
