"""`gputop report`: summarize a recording; write metrics.json; gate on a baseline."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "report",
        parents=[common],
        help="summarize a recording; compare it with a baseline",
        description="Per GPU: utilization mean/p5/p50/p95, peak memory, mean power, energy, time "
        "throttled and why; per training process: steps/s, p50/p95 step time, DataLoader wait; "
        "the findings as a timeline; charts. The throughput and step times are the training job's "
        "that drives the GPUs (named, by pid and command). Writes PATH.metrics.json next to the "
        "recording. With "
        "--baseline, exits 1 when throughput fell or p95 step time rose by more than "
        "--max-regression; when both recordings hold a capture's traces (PATH/captures/, "
        "e.g. `gputop capture PID --out PATH/captures`), a failure on step times is followed "
        "by the compare of the two (`gputop analyze --compare`): what changed, by cause.",
    )
    p.add_argument("recording", metavar="PATH", help="a recording made by `gputop record`")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--html", metavar="FILE", nargs="?", const="",
                   help="also write a self-contained HTML page (default FILE: PATH.html beside "
                   "the recording)")
    p.add_argument("--metrics", metavar="FILE",
                   help="where to write the metrics (default: PATH.metrics.json beside PATH)")
    p.add_argument("--baseline", metavar="OTHER", help="a recording or metrics.json to compare with")
    p.add_argument("--max-regression", default="5%", metavar="PCT",
                   help="allowed throughput drop / p95 step time rise (default 5%%)")


def run(args: argparse.Namespace) -> int:
    # Imported here (pandas, pyarrow): every command module is loaded to build --help.
    from gputop.recording.render import format_html, format_report
    from gputop.recording.store import RecordingError, atomic_write_bytes, read_recording
    from gputop.recording.summary import (
        compare,
        default_metrics_path,
        load_metrics,
        parse_regression,
        summarize,
    )

    try:
        max_regression = parse_regression(args.max_regression)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    path = Path(args.recording)
    try:
        rec = read_recording(path)
        summary = summarize(rec)
        baseline = load_metrics(Path(args.baseline)) if args.baseline else None
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    from gputop.core.format import safe_text  # what a library said of a part can quote its bytes

    for part in rec.bad_parts:  # one line each: the part and why
        print(safe_text(f"gputop: warning: skipped {path}/{part}"), file=sys.stderr)
    for gap in rec.gaps:  # and the time they leave without samples
        print(safe_text(f"gputop: warning: {path}: {gap}"), file=sys.stderr)
    # The report first: a folder we cannot write to must not cost the user the report.
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        print(format_report(summary, rec, width=min(100, os.get_terminal_size(2).columns - 14)
                            if sys.stderr.isatty() else 72))
    sys.stdout.flush()
    status = 0
    # Beside the recording and named after it, not in it: pandas.read_parquet(PATH) must see
    # only Parquet, and two recordings in one folder keep their own metrics.
    metrics_path = Path(args.metrics) if args.metrics else default_metrics_path(path)
    html_path = None
    if args.html is not None:  # `--html` alone: named after the recording, beside it
        beside = path.resolve()
        html_path = Path(args.html) if args.html else beside.parent / f"{beside.name}.html"
    for target, data in ((metrics_path, json.dumps(summary["metrics"], indent=1)),
                         (html_path, format_html(summary, rec) if html_path else None)):
        if target is None:
            continue
        try:
            atomic_write_bytes(target, data.encode())
            if target == html_path:
                print(f"gputop: HTML report written to {target}", file=sys.stderr)
        except OSError as exc:
            hint = "" if args.metrics or target != metrics_path else "; choose another with --metrics FILE"
            print(f"gputop: cannot write {target}: {exc.strerror or exc}{hint}", file=sys.stderr)
            # Only a file the user asked for by name is a failure; the default one is a bonus.
            if target != metrics_path or args.metrics:
                status = 1
    if baseline is not None:
        try:
            regressed, reason = compare(summary["metrics"], baseline, max_regression)
        except RecordingError as exc:
            raise UsageError(str(exc)) from None
        print(f"gputop: {reason}", file=sys.stderr)
        if regressed and ("step time" in reason or "throughput" in reason):
            from gputop.commands.report_why import explain

            explain(path, Path(args.baseline))
        return 1 if regressed else status
    return status
