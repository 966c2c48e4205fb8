"""`gputop stacks PID`: the Python functions and lines a process and its DataLoader workers
spend their time in, sampled from outside with py-spy (no agent, no restart)."""

from __future__ import annotations

import argparse
import json

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "stacks",
        parents=[common],
        help="sample the Python stacks of any process and its DataLoader workers (py-spy; "
        "no agent needed)",
        description=(
            "Sample PID and the processes under it (DataLoader workers) with py-spy for a few "
            "seconds, without stopping them and without running code in them, then print per "
            "process how much of the time its threads ran, the top functions and lines of "
            "that work, where idle threads wait, and every thread's current stack (whole "
            "stacks when the process looks stuck). Needs the right to ptrace PID: the same "
            "user (or root) and a kernel that allows it; otherwise one line says why."
        ),
    )
    p.add_argument("pid", help="process id of the training (or any Python) process")
    p.add_argument("--seconds", type=float, default=3.0, metavar="N",
                   help="how long to sample, in whole seconds (default 3)")
    p.add_argument("--rate", type=int, default=None, metavar="HZ",
                   help="samples per second per thread (default 100, py-spy's)")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object (fields in docs/stacks.md)")


def run(args: argparse.Namespace) -> int:
    from gputop.stacks.access import StacksError
    from gputop.stacks.pyspy import DEFAULT_RATE, MAX_SECONDS, sample_stacks
    from gputop.stacks.render import format_stacks

    try:
        pid = int(args.pid)
    except ValueError:
        raise UsageError(f"PID must be a process id, not {args.pid!r}") from None
    if pid <= 0:
        raise UsageError("PID must be a positive process id")
    if not 1 <= args.seconds <= MAX_SECONDS:
        raise UsageError(f"--seconds must be between 1 and {MAX_SECONDS}")
    rate = DEFAULT_RATE if args.rate is None else args.rate
    if not 1 <= rate <= 1000:
        raise UsageError("--rate must be between 1 and 1000")
    try:
        report = sample_stacks(pid, args.seconds, rate)
    except StacksError as exc:
        raise UsageError(str(exc), exit_code=1) from None
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(format_stacks(report, _command(pid)))
    return 0


def _command(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    return " ".join(p.decode(errors="replace") for p in raw.split(b"\0") if p) or None
