"""`gputop capture PID`: record a few training steps of a process through its agent, then
diagnose the trace (the `gputop analyze` report).

Works on any host: it needs the agent's socket, not NVML.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from gputop.core.errors import UsageError
from gputop.core.format import safe_text


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "capture",
        parents=[common],
        help="profile a few steps of a training process (with the agent) and diagnose them",
        description=(
            "Ask the gputop agent in PID to record N training steps with torch.profiler "
            "(started and stopped at optimizer steps), save the trace where TensorBoard and "
            "Perfetto open it, and print the diagnosis, with where in the code the time went "
            "(py-spy samples of the process and its DataLoader workers, joined to the steps). "
            "The process needs the agent: start it with `gputop run -- CMD` or call "
            "gputop.agent.install() in it."
        ),
        epilog=(
            "Bounded by design: no Python tracer, shapes or memory events unless asked; at most "
            "32 MB of trace JSON per recorded step (the shortest events are cut beyond it, and "
            "the report says what); recording stops at the first step after 30 s; a job whose "
            "steps would not fit in --timeout (or that makes none) gets a 5 s time window of "
            "all threads instead, with a note. Never kills or pauses the job."
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
        help="the capture's deadline (default 60 s): steps that would not fit in it are "
        "recorded as a time window instead; the steps recorded when it passes are kept",
    )
    p.add_argument("--record-shapes", action="store_true",
                   help="record operator input shapes (more detail, a larger trace; cut to "
                   "the size budget)")
    p.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=False,
                   help="also run the profiler's Python tracer (every Python call an event: "
                   "slows a Python-heavy job many times while it records; the trace is cut to "
                   "its size budget). Off by default: py-spy samples say where in the code")
    p.add_argument("--profile-memory", action="store_true",
                   help="record tensor allocations (cut to the size budget)")
    p.add_argument("--no-stacks", dest="stacks", action="store_false",
                   help="do not sample Python stacks with py-spy during the capture")
    p.add_argument(
        "--json",
        action="store_true",
        help='print the analysis as JSON, with "trace": the trace path',
    )


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
    """One status line on stderr while we wait, from the agent's ``status`` (the service
    polls it): refreshed in place on a terminal, one line otherwise."""

    def __init__(self, pid: int, enabled: bool) -> None:
        self.pid, self.enabled = pid, enabled
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self._last = ""

    def __call__(self, capture: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if not self.tty:  # one line, once the agent answered (a wrong PID gets only its error)
            if not self._last:
                print(f"gputop: capturing pid {self.pid} ...", file=sys.stderr, flush=True)
                self._last = "said"
            return
        from gputop.client.agents import progress_text

        line = (f"gputop: capturing pid {self.pid}: {progress_text(capture)} "
                f"({time.monotonic() - self.started:.0f} s)")
        if line != self._last:
            print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)
            self._last = line

    def done(self) -> None:
        if self.tty and self._last:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self._last = ""


def settings_of(args: argparse.Namespace):
    from gputop.capture.service import CaptureSettings

    return CaptureSettings(steps=args.steps, seconds=args.seconds, warmup=args.warmup,
                           timeout=args.timeout, out=args.out, with_stack=args.with_stack,
                           record_shapes=args.record_shapes, profile_memory=args.profile_memory,
                           sample_stacks=args.stacks)


def _report(result, as_json: bool) -> tuple[str, int]:
    """The `gputop analyze` report of the capture (and where in the code), and the status."""
    if as_json:
        return json.dumps(result.to_json()), 0 if result.analysis is not None else 1
    trace = safe_text(result.trace)  # the agent chose it: no terminal escapes
    if result.analysis is None:
        return (f"trace: {trace}\ngputop: error: cannot analyze the trace: "
                f"{safe_text(result.error)}"), 1
    from gputop.diagnostics.trace.reporting.report import format_report

    directory = os.path.dirname(trace)
    footer = (
        f"\ntrace: {trace}\n"
        f"open it in https://ui.perfetto.dev or with `tensorboard --logdir {directory}`"
    )
    source = result.source_text()
    report = format_report(result.analysis).rstrip("\n") + (f"\n\n{source}" if source else "")
    return report + "\n" + footer, 0


def run(args: argparse.Namespace) -> int:
    # The service is imported here, not at the top: every command's module is imported to
    # build the parser, and `gputop analyze` should not pay for the others' imports.
    from gputop.capture.service import CaptureFailed, capture

    pid = _validate(args)
    if args.job:
        from gputop.commands import capture_job

        return capture_job.run(args, pid, settings_of(args))
    progress = _Progress(pid, enabled=True)
    try:
        result = capture(pid, settings_of(args), on_progress=progress)
    except CaptureFailed as exc:
        raise UsageError(str(exc), exit_code=1) from None
    except KeyboardInterrupt:
        progress.done()
        # Leaving closes the connection: the agent sees its client gone and stops the
        # profiler at the job's next step; the job itself goes on.
        print(f"gputop: capture of pid {pid} stopped (Ctrl-C): the agent stops the profiler "
              "at the next step and keeps no trace; the job goes on, unharmed",
              file=sys.stderr, flush=True)
        return 130
    finally:
        progress.done()
    for note in result.notes:
        print(f"gputop: warning: {note}", file=sys.stderr)
    text, status = _report(result, args.json)
    print(text)
    return status
