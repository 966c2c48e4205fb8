"""A capture request from the monitor, checked field by field before anything starts: the
number of steps and warm-up steps, or a time window, the deadline, the optional tracer, shapes
and memory events, and where the trace goes. A bad field is one ``bad-request`` error."""

from __future__ import annotations

import os
from typing import Any

from gputop.agent.trace_export import CaptureError
from gputop.core.protocol import DEFAULT_STEPS, MAX_STEPS
from gputop.core.validate import number

MAX_WARMUP = 100
MAX_SECONDS = 600.0
DEFAULT_WARMUP = 1  # one discarded step keeps the profiler's own start-up out of the trace
DEFAULT_TIMEOUT_S = 60.0

_BOOL_FIELDS = ("record_shapes", "with_stack", "profile_memory")


def param(params: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = params.get(name)
    if value is None:
        return None
    if number(value) is None:
        raise CaptureError("bad-request", f"{name} must be a number")
    found = number(value, low, high)
    if found is None:
        raise CaptureError("bad-request", f"{name} must be between {low:g} and {high:g}")
    return float(found)


def integer(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CaptureError("bad-request", f"{name} must be an integer")
    if not low <= value <= high:
        raise CaptureError("bad-request", f"{name} must be between {low} and {high}")
    return value


def parse_capture_request(message: dict[str, Any]) -> dict[str, Any]:
    """Validate a ``capture`` request into a complete parameter dict (or CaptureError)."""
    allowed = {"cmd", "steps", "warmup", "seconds", "timeout", "out", "start_step", *_BOOL_FIELDS}
    unknown = sorted(repr(str(k)[:40]) for k in message if k not in allowed)
    if unknown:
        raise CaptureError("bad-request", f"unknown field(s) for capture: {', '.join(unknown)}")
    steps = integer(message, "steps", 1, MAX_STEPS)
    warmup = integer(message, "warmup", 0, MAX_WARMUP)
    seconds = param(message, "seconds", 0.05, MAX_SECONDS)
    timeout = param(message, "timeout", 0.1, 86400.0)
    if seconds is not None and (steps is not None or warmup is not None):
        raise CaptureError("bad-request", "give either steps (and warmup) or seconds, not both")
    # The optimizer step (as this agent counts them, from 1) at which to start: every rank of
    # a job steps in lockstep, so one number starts all of them on the same iteration.
    start_step = integer(message, "start_step", 0, 1 << 53)
    if start_step is not None and seconds is not None:
        raise CaptureError("bad-request", "start_step goes with steps, not seconds")
    params: dict[str, Any] = {
        "mode": "seconds" if seconds is not None else "steps",
        "steps": DEFAULT_STEPS if steps is None else steps,
        "warmup": DEFAULT_WARMUP if warmup is None else warmup,
        "seconds": seconds,
    }
    if seconds is not None:
        params["steps"] = params["warmup"] = 0
    params["timeout"] = (
        timeout
        if timeout is not None
        else (DEFAULT_TIMEOUT_S if seconds is None else seconds + DEFAULT_TIMEOUT_S)
    )
    for name in _BOOL_FIELDS:
        value = message.get(name, False)
        if not isinstance(value, bool):
            raise CaptureError("bad-request", f"{name} must be true or false")
        params[name] = value
    out = message.get("out")
    if out is not None:
        if not isinstance(out, str) or not out or len(out) > 4096 or not out.isprintable():
            raise CaptureError("bad-request", "out must be a directory path")
        if not os.path.isabs(out):
            raise CaptureError("bad-request", "out must be an absolute path")
    params["out"] = out
    params["start_step"] = start_step
    return params
