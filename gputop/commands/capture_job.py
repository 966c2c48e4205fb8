"""`gputop capture --job PID`: record the same steps on every rank of PID's job and diagnose
them together (which rank holds the others back, and why).

PID is any rank of the job, or its launcher (torchrun). Every rank's agent is asked to start at
one step number (``gputop.client.jobs``), so the traces cover the same iterations; each rank's
trace is analysed on its own, then the ranks are compared (``gputop.diagnostics.trace.ranks``).
A rank that does not answer or dies on the way is named on stderr; the others are still
analysed, and the exit status is 0 as long as one rank was.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gputop.core.errors import UsageError
from gputop.core.format import safe_text


def run(args: argparse.Namespace, pid: int, settings) -> int:
    """``settings``: the service's CaptureSettings from the same options."""
    from gputop.capture.service import CaptureFailed, capture_job

    def unreachable(job) -> None:
        for note in job.unreachable:
            print(f"gputop: warning: {safe_text(note)}", file=sys.stderr)

    progress = None if args.json else (lambda text: print(f"gputop: {text}", file=sys.stderr))
    try:
        done = capture_job(pid, settings, on_progress=progress, on_job=unreachable)
    except CaptureFailed as exc:
        raise UsageError(str(exc), exit_code=2 if exc.code == "usage" else 1) from None
    for problem in [*done.failed, *done.problems]:
        print(f"gputop: warning: {problem}", file=sys.stderr)
    if not done.analyses:
        print("gputop: error: no rank of the job gave a trace to analyse", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_json(done.capture, done.analyses, done.cross)))
    else:
        print(_text(done.capture, done.analyses, done.cross))
    return 0


def _json(result, analyses, cross) -> dict[str, Any]:
    ranks = []
    for rc in result.ranks:
        row = rc.to_json()
        match = next((a for a, r in analyses if r is rc), None)
        if match is not None:
            row["verdict"] = match.verdict
            row["analysis"] = match.to_json()
        ranks.append(row)
    findings = cross.findings if cross is not None else []
    return {
        "job": result.job.to_json(),
        "start_step": result.start_step,
        "aligned": result.aligned(),
        "directory": str(result.directory),
        "traces": [rc.reply["trace"] for rc in result.captured],
        "ranks": ranks,
        "failed": [rc.to_json() for rc in result.failed],
        "cross_rank": cross.to_json() if cross is not None else None,
        "findings": [f.to_json() for f in findings],
        "verdict": findings[0].id if findings else None,
    }


def _text(result, analyses, cross) -> str:
    from gputop.diagnostics.trace.reporting.report import format_cross_rank

    first = next((r.reply.get("first_recorded_step") for r in result.captured), None)
    lines = [f"gputop capture --job: {len(result.captured)} of {len(result.ranks)} ranks "
             f"recorded steps from {first} (job {result.job.job_id})"]
    for a, rc in sorted(analyses, key=lambda x: (x[1].agent.rank is None, x[1].agent.rank)):
        top = next((f for f in a.findings if f.severity != "info"), None)
        what = (f"{top.id}: {top.title}" if top else
                f"{a.verdict}: {a.healthy_reason}" if a.healthy_reason else a.verdict)
        lines.append(f"  rank {rc.agent.rank} (pid {rc.agent.pid}): {what}")
    lines.append("")
    if cross is not None:
        lines.append(format_cross_rank(cross).rstrip("\n"))
    lines.append("")
    lines.append(f"traces: {result.directory}  (one per rank; `gputop analyze {result.directory}/*`"
                 " for each rank's full report; open them in https://ui.perfetto.dev or with "
                 f"`tensorboard --logdir {result.directory}`)")
    return "\n".join(safe_text(line) for text in lines for line in text.split("\n"))
