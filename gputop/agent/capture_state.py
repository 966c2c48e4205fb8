"""One capture's state, from request to reply (``profiling.CaptureController`` drives it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from gputop.core.protocol import DEFAULT_STEPS, JSON_PER_STEP


class CaptureJob:
    """One capture, from request to reply; fields are read by ``status`` on other threads."""

    def __init__(self, params: dict[str, Any], directory: Path) -> None:
        self.params = params
        self.directory = directory
        self.state = "waiting"  # waiting -> warmup -> recording -> exporting (or cancelling)
        self.requested_at = time.monotonic()
        self.steps_seen = 0  # profiler steps since start (warm-up included)
        self.marks: list[float] = []  # perf_counter at each step boundary while profiling
        self.profiler: Any = None
        # gputop.agent.quiet is on from the profiler's start to its stop: one filter thread for
        # the whole recording, not one started and joined on the training thread every step
        # (on a busy host each start waited tens of ms for a CPU).
        self.quiet = False
        self.trace_ready = False
        self.cancel_code: str | None = None
        self.cancel_message = ""
        self.blocked_s = 0.0  # training-thread time spent in capture code
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None
        self.reply_sent = threading.Event()  # the server wrote the reply to the socket
        self.steps_at_request = 0  # the agent's step count when asked
        self.first_step: int | None = None  # the step count at which the profiler started
        # time.time() - time.perf_counter(): the marks in wall-clock time, so the monitor can
        # place its Python stack samples (py-spy) on the trace's steps.
        self.wall_offset = time.time() - time.perf_counter()
        self.train_thread: int | None = None  # threading.get_ident() of the training thread
        self.finish_reason: str | None = None  # stop at the next step boundary, and why
        self.cut: list[str] = []  # what this capture left out, one line each
        self.notes: list[str] = []  # what it did instead of what was asked
        self.usual_step_s: float | None = None  # the job's p50 step time when asked

    @property
    def budget(self) -> int:
        """Bytes of trace JSON this capture may write."""
        steps = self.params["steps"] if self.params["mode"] == "steps" else DEFAULT_STEPS
        return JSON_PER_STEP * max(1, steps)

    def progress(self) -> dict[str, Any]:
        p = self.params
        recorded = max(0, self.steps_seen - p["warmup"])
        return {
            "state": self.state,
            "mode": p["mode"],
            "steps_total": p["steps"],
            "steps_done": min(recorded, p["steps"]),
            "warmup": p["warmup"],
            "seconds": p["seconds"],
            "elapsed_s": round(time.monotonic() - self.requested_at, 3),
        }
