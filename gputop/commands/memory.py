"""`gputop memory PID`: where a training process's memory goes (what grows, by source line; what
the step's peak is made of; reserved versus allocated), through its agent; `gputop memory
--last-oom PID-or-FILE`: what held the memory when a job ran out of it.

Works on any host: it needs the agent's socket (or the report file), not NVML.
"""

from __future__ import annotations

import argparse
import json
import sys

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "memory",
        parents=[common],
        help="where a training process's memory goes: growth by source line, the peak's "
             "parts, fragmentation; --last-oom: what held it at an out-of-memory error",
        description=(
            "Ask the gputop agent in PID to record the allocations of N optimizer steps (after "
            "one warm-up step) and say which source lines' allocations stay alive and grow "
            "(bytes per step, and what keeps them where Python can see it), what the step's "
            "peak is made of (parameters, gradients, optimizer state, activations, other), "
            "and reserved versus allocated memory with the allocator's segments "
            "(fragmentation named when it is the cause, with the setting that addresses it). "
            "On CUDA it uses the caching allocator's history, otherwise the profiler's memory "
            "events. The process needs the agent: start it with `gputop run -- CMD`. "
            "With --last-oom, print the report the agent wrote when the process hit an "
            "out-of-memory error (its pid, even after it died, or the report file)."
        ),
        epilog=(
            "Bounded like a capture: recording stops at the first step after 30 s; on CUDA the "
            "allocator's history holds 20,000 events and is on only while it records; without "
            "CUDA the profiler records memory events (no Python tracer: each operator is marked "
            "with the source line that called it) only for the recorded steps, and a step it "
            "makes 3x slower ends the recording. The report is a JSON file of a few KB "
            "(mode 0600) beside the captures' traces. Never pauses or kills the job."
        ),
    )
    p.add_argument("pid", nargs="?", help="process id of the training process")
    p.add_argument("--steps", type=int, default=3, metavar="N",
                   help="optimizer steps to record after the warm-up step (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="the capture's deadline (default 60 s); the steps recorded when it "
                        "passes are kept")
    p.add_argument("--out", metavar="DIR",
                   help="directory for the report (default: $GPUTOP_CAPTURE_DIR or "
                        "$XDG_STATE_HOME/gputop/captures)")
    p.add_argument("--last-oom", metavar="PID-or-FILE",
                   help="show the out-of-memory report of a process (it may have died of it) "
                        "or a report file, instead of capturing")
    p.add_argument("--json", action="store_true",
                   help='print the report as JSON, with "verdicts" and "report": its path')


def _pid(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        raise UsageError(f"PID must be a process id, not {text!r}") from None
    if pid <= 0:
        raise UsageError("PID must be a positive process id")
    return pid


def _command(pid: int) -> str | None:
    from gputop.capture.service import process_cmdline
    from gputop.core.format import safe_text

    words = process_cmdline(pid)
    return safe_text(" ".join(words))[:120] if words else None


def _print(report, path: str, as_json: bool, data: dict | None = None,
           command: str | None = None, owner: str | None = None) -> None:
    """The report as text, or as JSON (``data``: the capture's own, with its "capture";
    ``owner``: whose file it is when it is not the caller's, said first)."""
    if as_json:
        from gputop.capture.memory.render import report_json
        from gputop.core.format import json_safe

        data = data if data is not None else report_json(report, path)
        if owner is not None:
            data["owner"] = owner
        sys.stdout.write(json_safe(json.dumps(data).encode()).decode() + "\n")
    else:
        from gputop.capture.memory.render import format_report
        from gputop.core.format import safe_text

        if owner is not None:
            print(safe_text(f"File of {owner}, not yours: what it says, that user wrote "
                            f"(anyone can name any pid in a report)"))
        print(format_report(report, path, command))


def _last_oom(args: argparse.Namespace) -> int:
    import os

    from gputop.capture.memory.oom_files import read_last_oom, whose_file
    from gputop.capture.memory.report import ReportError

    try:
        path, report, uid = read_last_oom(args.last_oom)
    except ReportError as exc:
        raise UsageError(str(exc), exit_code=1) from None
    if report.kind != "oom":
        raise UsageError(f"{path}: a memory capture's report, not an out-of-memory one",
                         exit_code=1)
    owner = whose_file(uid) if uid is not None and uid != os.geteuid() else None
    _print(report, path, args.json, owner=owner)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.last_oom is not None:
        if args.pid is not None:
            raise UsageError("give either PID (a memory capture) or --last-oom, not both")
        return _last_oom(args)
    if args.pid is None:
        raise UsageError("give the PID of a training process, or --last-oom PID-or-FILE")
    pid = _pid(args.pid)
    if not 1 <= args.steps <= 100:
        raise UsageError("--steps must be between 1 and 100")
    if not 0.1 <= args.timeout <= 86400:
        raise UsageError("--timeout must be between 0.1 and 86400 seconds")
    from gputop.capture.service import MEMORY, CaptureFailed, CaptureSettings, capture
    from gputop.commands.capture import _Progress

    progress = _Progress(pid, enabled=True)
    try:
        result = capture(pid, CaptureSettings(steps=args.steps, timeout=args.timeout,
                                              out=args.out, sample_stacks=False),
                         kind=MEMORY, on_progress=progress)
    except CaptureFailed as exc:
        raise UsageError(str(exc), exit_code=1) from None
    finally:
        progress.done()
    _print(result.report, result.path, args.json, result.to_json(), _command(pid))
    return 0
