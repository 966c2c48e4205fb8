"""Ask a training process's agent for a step-aligned capture and wait for the trace.

The blocking client behind the live monitor's `p` key (run it in a thread, never on an event
loop). While it waits it can report the agent's progress and give up when asked to: closing the
connection makes the agent cancel the capture, so nothing keeps profiling after we leave.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from gputop.ipc import AgentConnection, AgentError, agent_status, check_reply

# Extra time allowed beyond the agent's own timeout: the trace export and a slow last step.
REPLY_MARGIN_S = 30.0
POLL_S = 0.25  # how often progress and should_stop are looked at while waiting

Progress = Callable[[dict[str, Any]], None]


def capture_message(steps: int, timeout: float, out: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"cmd": "capture", "steps": steps, "timeout": timeout}
    out = out or os.environ.get("GPUTOP_CAPTURE_DIR")
    if out:
        message["out"] = os.path.abspath(os.path.expanduser(out))
    return message


def progress_text(capture: dict[str, Any]) -> str:
    """The agent's ``status["capture"]`` in a few words: "recording step 2/3"."""
    state = capture.get("state") or "starting"
    if state in ("warmup", "recording") and capture.get("mode") == "steps":
        return f"{state} step {capture.get('steps_done', 0)}/{capture.get('steps_total')}"
    if state == "waiting":
        return "waiting for the next optimizer step"
    return str(state)


def request_capture(
    pid: int,
    steps: int = 3,
    timeout: float = 60.0,
    *,
    out: str | None = None,
    on_progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Record ``steps`` optimizer steps of ``pid``; returns the agent's reply (with "trace").

    ``on_progress`` gets the agent's ``status["capture"]`` dict about every POLL_S seconds;
    when ``should_stop()`` turns true the request is abandoned (the agent cancels it).
    Every failure raises ``ipc.AgentError`` with a one-line message.
    """
    deadline = time.monotonic() + timeout + REPLY_MARGIN_S
    with AgentConnection(pid, timeout=5.0) as conn:
        conn.send(capture_message(steps, timeout, out))
        while not conn.wait_readable(POLL_S):
            if should_stop is not None and should_stop():
                raise AgentError(f"capture of pid {pid} abandoned", "cancelled")
            if time.monotonic() > deadline:
                raise AgentError(f"agent of pid {pid} did not answer in time", "timeout")
            if on_progress is not None:
                status = agent_status(pid, timeout=POLL_S)
                if status is not None and isinstance(status.get("capture"), dict):
                    on_progress(status["capture"])
        try:
            reply = check_reply(conn.receive(max(0.1, deadline - time.monotonic())), pid)
        except AgentError as exc:
            if exc.code == "exited":
                raise AgentError(f"process {pid} exited during the capture", "exited") from None
            raise
    if not isinstance(reply.get("trace"), str) or not reply["trace"]:
        raise AgentError(f"agent of pid {pid} replied without a trace path", "protocol")
    return reply
