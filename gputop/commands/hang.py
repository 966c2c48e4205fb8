"""`gputop hang PID|JOB_ID`: why is my job stuck. Every local rank's Flight Recorder buffer
(through its agent) and Python stack (py-spy), collected at the same moment, then joined:
the rank that never reached a collective, the collective, its sequence number and the line."""

from __future__ import annotations

import argparse
import json

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "hang",
        parents=[common],
        help="name the rank a stuck job waits for: every rank's Flight Recorder and stack, "
        "at once",
        description=(
            "Collect, at the same moment, every local rank's Flight Recorder buffer (through "
            "its gputop agent: start the job with `gputop run`, which turns Flight Recorder "
            "on) and every rank's Python stack (py-spy: it reads a rank that holds the GIL "
            "and cannot answer its agent), then join them per process group and sequence "
            "number: which ranks never reached collective N and where they are, which wait "
            "in it and since when, a desync (different collectives at one sequence number), "
            "and a rank that exited. TARGET is any rank's pid, the launcher's pid (torchrun) "
            "or a job id as `gputop snapshot --json` lists it. Example: gputop hang 12345"
        ),
    )
    p.add_argument("target", metavar="PID|JOB_ID",
                   help="a rank's pid, its launcher's pid, or the job id")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: verdict, findings (the hang finding carries "
                   "ranks, waiting_ranks, collective, process_group, seq), the ranks collected")
    p.add_argument("--no-stacks", action="store_true",
                   help="Flight Recorder only: do not read the ranks' stacks with py-spy")


def run(args: argparse.Namespace) -> int:
    from gputop.capture.hang import HangError, collect
    from gputop.capture.hang_report import join, to_json, to_text

    target = str(args.target).strip()
    if not target or len(target) > 256 or not target.isprintable():
        raise UsageError("PID|JOB_ID must be a process id or a job id (one short line)")
    if target.isdigit() and int(target) <= 0:
        raise UsageError("PID must be a positive process id")
    try:
        live = join(collect(target, stacks=not args.no_stacks))
    except HangError as exc:
        raise UsageError(str(exc), exit_code=1) from None
    if args.json:
        print(json.dumps(to_json(live)))
    else:
        print(to_text(live))
    return 0
