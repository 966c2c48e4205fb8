"""`gputop capture PID`: record a few training steps of a process through its agent, then
diagnose the trace (the `gputop analyze` report).

Works on any host: it needs the agent's socket, not NVML.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from gputop.errors import UsageError
from gputop.format import safe_text


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "capture",
        parents=[common],
        help="profile a few steps of a training process (with the agent) and diagnose them",
        description=(
            "Ask the gputop agent in PID to record N training steps with torch.profiler "
            "(started and stopped at optimizer steps), save the trace where TensorBoard and "
            "Perfetto open it, and print the diagnosis. The process needs the agent: start it "
            "with `gputop run -- CMD` or call gputop.agent.install() in it."
        ),
    )
    p.add_argument("pid", help="process id of the training process (with --job: any rank of "
                              "the job, or its launcher)")
    p.add_argument("--job", action="store_true",
                   help="capture every rank of PID's job on this node at the same steps and "
                        "compare them: which rank holds the others back, and why")
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--steps", type=int, metavar="N", help="optimizer steps to record (default 3)"
    )
    what.add_argument(
        "--seconds",
        type=float,
        metavar="S",
        help="record a time window of all threads instead (for inference or a stuck job)",
    )
    p.add_argument("--warmup", type=int, metavar="N", help="steps run before recording (default 1)")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="directory for the trace (default: "
        "$GPUTOP_CAPTURE_DIR or $XDG_STATE_HOME/gputop/captures)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="give up after S seconds (default 60)",
    )
    p.add_argument("--record-shapes", action="store_true", help="record operator input shapes")
    p.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=True,
                   help="record Python stacks, so the report names the source lines of the "
                        "top costs (default; --no-with-stack for a lighter trace)")
    p.add_argument("--profile-memory", action="store_true", help="record tensor allocations")
    p.add_argument(
        "--json",
        action="store_true",
        help='print the analysis as JSON, with "trace": the trace path',
    )


def _request(args: argparse.Namespace) -> dict[str, Any]:
    message: dict[str, Any] = {"cmd": "capture", "timeout": args.timeout}
    if args.seconds is not None:
        message["seconds"] = args.seconds
    else:
        message["steps"] = 3 if args.steps is None else args.steps
        if args.warmup is not None:
            message["warmup"] = args.warmup
    out = args.out or os.environ.get("GPUTOP_CAPTURE_DIR")
    if out:
        message["out"] = os.path.abspath(os.path.expanduser(out))
    for name in ("record_shapes", "with_stack", "profile_memory"):
        if getattr(args, name):
            message[name] = True
    return message


def _validate(args: argparse.Namespace) -> int:
    try:
        pid = int(args.pid)
    except ValueError:
        raise UsageError(f"PID must be a process id, not {args.pid!r}") from None
    if pid <= 0:
        raise UsageError("PID must be a positive process id")
    if args.steps is not None and not 1 <= args.steps <= 1000:
        raise UsageError("--steps must be between 1 and 1000")
    if args.warmup is not None and not 0 <= args.warmup <= 100:
        raise UsageError("--warmup must be between 0 and 100")
    if args.warmup is not None and args.seconds is not None:
        raise UsageError("--warmup goes with --steps, not --seconds")
    if args.seconds is not None and not 0.05 <= args.seconds <= 600:
        raise UsageError("--seconds must be between 0.05 and 600")
    if not 0.1 <= args.timeout <= 86400:
        raise UsageError("--timeout must be between 0.1 and 86400 seconds")
    return pid


class _Progress:
    """One status line on stderr while we wait, refreshed from the agent's `status`."""

    def __init__(self, pid: int, enabled: bool) -> None:
        self.pid = pid
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._last = ""

    def __enter__(self) -> _Progress:
        if self.enabled:
            if not self.tty:
                print(f"gputop: capturing pid {self.pid} ...", file=sys.stderr, flush=True)
            else:
                self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1.0)
        if self.tty and self._last:
            print("\r\033[K", end="", file=sys.stderr, flush=True)

    def _loop(self) -> None:
        from gputop.agent.client import agent_status

        started = time.monotonic()
        while not self._stop.wait(0.25):
            status = agent_status(self.pid, timeout=0.3)
            capture = (status or {}).get("capture") or {}
            state = capture.get("state", "...")
            elapsed = time.monotonic() - started
            if state in ("warmup", "recording") and capture.get("mode") == "steps":
                detail = f"{state} step {capture.get('steps_done', 0)}/{capture.get('steps_total')}"
            elif state == "waiting":
                detail = "waiting for the next optimizer step"
            else:
                detail = str(state)
            line = f"gputop: capturing pid {self.pid}: {detail} ({elapsed:.0f} s)"
            if line != self._last and not self._stop.is_set():
                print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)
                self._last = line


def _capture(pid: int, message: dict[str, Any], show_progress: bool) -> dict[str, Any]:
    """Send the request and wait for the trace; any failure is a one-line UsageError."""
    from gputop.agent.client import (
        REPLY_MARGIN_S,
        AgentConnection,
        AgentError,
        check_reply,
        checked_trace_reply,
    )

    wait = message["timeout"] + REPLY_MARGIN_S  # --timeout is the user's: honoured
    try:
        with AgentConnection(pid, timeout=5.0) as conn, _Progress(pid, show_progress):
            conn.send(message)
            return checked_trace_reply(check_reply(conn.receive(wait), pid), pid,
                                       conn.peer_uid, conn.root)
    except AgentError as exc:
        if exc.code == "exited":
            raise UsageError(f"process {pid} exited during the capture", exit_code=1) from None
        raise UsageError(safe_text(exc), exit_code=1) from None


def process_cmdline(pid: int) -> list[str] | None:
    """The command line of the captured process, for next steps that relaunch it under a
    profiler (None when it cannot be read)."""
    try:
        import psutil

        return psutil.Process(pid).cmdline() or None
    except Exception:
        return None


def _analysis(trace: str, as_json: bool, limits: Any = None,
              pid: int | None = None) -> tuple[str, int]:
    """The `gputop analyze` report of the trace, and the exit status."""
    try:
        from gputop.diagnostics.trace import TraceError, analyze_trace
        from gputop.diagnostics.trace_report import format_report
    except ImportError as exc:
        note = f"trace analysis is not available ({exc})"
        if as_json:
            return json.dumps({"trace": trace, "error": note}), 1
        return f"trace: {trace}\n{note}", 1
    try:
        kwargs: dict = {"pid": pid, "cmdline": process_cmdline(pid) if pid else None}
        if limits is not None:
            kwargs["limits"] = limits
        result = analyze_trace(trace, **kwargs)
    except TraceError as exc:
        if as_json:
            return json.dumps({"trace": trace, "error": str(exc)}), 1
        return (f"trace: {safe_text(trace)}\ngputop: error: cannot analyze the trace: "
                f"{safe_text(exc)}"), 1
    from gputop.diagnostics.stack_lines import format_source_lines, top_source_lines

    source = top_source_lines(trace, limits) if limits is not None else top_source_lines(trace)
    if as_json:
        data = result.to_json()
        if isinstance(data, str):
            data = json.loads(data)
        data["trace"] = trace
        data["source_lines"] = [cost.to_json() for cost in source]
        return json.dumps(data), 0
    trace = safe_text(trace)  # the agent chose it: no terminal escapes
    directory = os.path.dirname(trace)
    footer = (
        f"\ntrace: {trace}\n"
        f"open it in https://ui.perfetto.dev or with `tensorboard --logdir {directory}`"
    )
    lines = format_source_lines(source)
    report = format_report(result).rstrip("\n") + (f"\n\n{lines}" if lines else "")
    return report + "\n" + footer, 0


def run(args: argparse.Namespace) -> int:
    # The agent's client is imported here, not at the top: every command's module is imported
    # to build the parser, and `gputop analyze` should not pay for the others' imports.
    from gputop.agent.client import partial_note, trace_limits

    pid = _validate(args)
    if args.job:
        from gputop.commands import capture_job

        return capture_job.run(args, pid)
    message = _request(args)
    reply = _capture(pid, message, show_progress=True)
    note = partial_note(reply)
    if note:
        print(f"gputop: warning: {note}", file=sys.stderr)
    text, status = _analysis(reply["trace"], args.json, trace_limits(reply), pid=pid)
    print(text)
    return status
