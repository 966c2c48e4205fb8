"""`gputop analyze TRACE|DIR [...] [--json]`: diagnose torch.profiler Chrome traces.

Where the step time went, the likely cause, the fix, and the next command to run. Several
traces of one job (one per rank) are also compared for a straggler.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "analyze",
        parents=[common],
        help="diagnose torch.profiler traces (where the step time went, the cause, the fix) "
        "or Flight Recorder dumps (which rank hangs the job)",
        description=(
            "Diagnose torch.profiler Chrome traces (tensorboard_trace_handler output or "
            "export_chrome_trace files, .json or .json.gz): a step-time breakdown, findings "
            "ordered by the time they cost with the fix and the next command to run, and the "
            "top operators and kernels. Several traces of one job (one per rank) are also "
            "compared for a straggler. A folder of Flight Recorder dumps (one per rank, pickle "
            "or JSON, told apart by content; docs/hangs.md) gives the hang's attribution: the "
            "ranks that never reached a collective, the collective, its process group and "
            "sequence number, desyncs. torch.compile's structured logs (TORCH_TRACE=DIR: a "
            "log, or the folder of per-rank logs) give recompiles with the guard that failed, "
            "graph breaks with their line, fallbacks to eager, compile time, and collective "
            "schedules that differ between ranks (desync). --compare BASE NEW says what "
            "changed between two traces."
        ),
        epilog=(
            "--json prints one JSON object per trace, one per line (JSON Lines): "
            '{"file", "metrics", "findings": [{"id", "severity", "title", "evidence", "fix", '
            '"next_step", ...}], "verdict", "healthy_reason", "assessed", "not_assessed"}. '
            "Flight Recorder dumps: one object per folder, {\"kind\": \"flight-recorder\", "
            '"verdict", "findings": [{"id": "hang", "ranks", "waiting_ranks", "collective", '
            '"process_group": {"id", "desc"}, "seq", "since_s", ...}], ...}. '
            "Exit status 2 if any trace could not be read (the others are still reported)."
        ),
    )
    p.add_argument("traces", nargs="*", metavar="TRACE",
                   help="trace file (.json or .json.gz), or a folder of them, such as the one "
                   "tensorboard_trace_handler writes (every trace in it is analysed); or a "
                   "folder of Flight Recorder dumps, one per rank (which rank hangs the job)")
    p.add_argument("--compare", nargs=2, metavar=("BASE", "NEW"),
                   help="what changed between two traces of one job (each a trace, a folder "
                   "of traces, or a recording with a captures/ folder): the step time of each, "
                   "its change split into idle time by cause and busy time by class, the "
                   "operators and kernels that changed most, findings appeared or cleared, "
                   "and a one-line verdict")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per trace, one per line (JSON Lines)",
    )
    p.add_argument("--max-trace-mb", type=float, default=None, metavar="MB",
                   help="refuse a trace larger than this once decompressed (default: no limit; "
                   "a trace of any size is read in batches, its size costs time, not memory)")
    p.add_argument("--max-events", type=int, default=None, metavar="N",
                   help="hold at most N events in memory (default 3000000, about 2 GB); past "
                   "it memory events, Python frames, then CPU operators are cut, shortest "
                   "first, and the report says so; more steps and device work than N refuse "
                   "the trace")
    p.add_argument("--max-dump-mb", type=float, default=None, metavar="MB",
                   help="refuse a Flight Recorder dump larger than this, unread (default 256)")
    p.add_argument("--plot", metavar="FILE.svg", default=None,
                   help="also draw each trace's roofline (the GPU's roofs, every op class as a "
                   "point sized by its GPU time) as an SVG; with several traces, FILE-2.svg "
                   "and on for the second and later")
    p.add_argument("--allow-special-files", action="store_true",
                   help="also read a FIFO or device, e.g. <(zcat trace.json.gz); refused by "
                   "default, since reading one may never end")


def _expand(paths: list[str]) -> tuple[list[str], list[str]]:
    """Each folder replaced by the traces in it; and a one-line error for each folder with
    none."""
    files: list[str] = []
    errors: list[str] = []
    for path in paths:
        if not os.path.isdir(path):
            files.append(path)
            continue
        from gputop.diagnostics.trace.loading.folder import traces_in

        found = traces_in(path)
        if not found:
            errors.append(f"{path}: no trace in this folder (*.json, *.json.gz)")
        files += found
    return files, errors


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _report_width() -> int:
    if not sys.stdout.isatty():
        return 100
    return max(60, min(120, shutil.get_terminal_size((100, 24)).columns))


def run(args: argparse.Namespace) -> int:
    # Imported here so `gputop --help` and the other commands never pay for the analysis code.
    from gputop.diagnostics.trace.analysis import TraceError, analyze_trace, compare_job
    from gputop.diagnostics.trace.loading.load import MAX_EVENTS, LoadLimits

    if (args.max_trace_mb is not None and not 0 < args.max_trace_mb <= 1e9) or (
            args.max_events is not None and args.max_events <= 0):
        raise UsageError("--max-trace-mb and --max-events must be positive")
    limits = LoadLimits(
        max_bytes=None if args.max_trace_mb is None else int(args.max_trace_mb * 1e6),
        max_events=MAX_EVENTS if args.max_events is None else args.max_events,
        allow_special=args.allow_special_files)
    if args.max_dump_mb is not None and not 0 < args.max_dump_mb <= 1e6:
        raise UsageError("--max-dump-mb must be positive")
    if args.compare:
        if args.traces:
            raise UsageError("--compare BASE NEW takes no other trace")
        from gputop.commands.analyze_compare import run_compare

        return run_compare(args, limits, _report_width())
    if not args.traces:
        raise UsageError("name a trace, a folder, a torch.compile log, or --compare BASE NEW")
    # Flight Recorder dumps (told apart by content) go to the hang attribution.
    from gputop.commands.analyze_dumps import run_dumps, split_dumps

    dump_jobs, trace_args = split_dumps(args.traces)
    dumps_failed = run_dumps(dump_jobs, args, _report_width()) if dump_jobs else False
    # torch.compile's structured logs (TORCH_TRACE), told apart by content too.
    from gputop.commands.analyze_compile import run_compile_logs, split_compile_logs

    log_jobs, trace_args = split_compile_logs(trace_args)
    if log_jobs:
        dumps_failed = run_compile_logs(log_jobs, args, _report_width()) or dumps_failed
    if not trace_args:
        sys.stdout.flush()
        return 2 if dumps_failed else 0
    traces, errors = _expand(trace_args)
    for error in errors:
        print(f"gputop: error: {_one_line(error)}", file=sys.stderr)
    analyses = []
    failed = bool(errors) or dumps_failed
    for path in traces:
        try:
            analyses.append(analyze_trace(path, limits))
        except TraceError as exc:
            failed = True
            print(f"gputop: error: {_one_line(exc)}", file=sys.stderr)
        except MemoryError:
            failed = True
            print(f"gputop: error: {path}: not enough memory to analyse it", file=sys.stderr)
        except Exception as exc:  # a trace shape we did not foresee: say so, in one line
            failed = True
            print(
                f"gputop: error: {path}: cannot analyse ({type(exc).__name__}: "
                f"{_one_line(exc)}); please report this trace",
                file=sys.stderr,
            )

    jobs = compare_job(analyses) if len(analyses) >= 2 else []
    if args.plot:
        from gputop.commands.analyze_plot import write_plots

        failed = write_plots(analyses, args.plot) or failed

    if args.json:
        import msgspec

        from gputop.core.format import json_safe

        encode = msgspec.json.Encoder().encode
        for a in analyses:  # names from the trace: no raw bidi or C1 character in the JSON
            sys.stdout.write(json_safe(encode(a.to_json())).decode() + "\n")
    else:
        from gputop.diagnostics.trace.reporting.report import format_report

        width = _report_width()
        for i, a in enumerate(analyses):
            if i:
                sys.stdout.write("\n" + "=" * width + "\n\n")
            try:
                text = format_report(a, width=width)
            except Exception as exc:  # numbers the report did not foresee: one line
                failed = True
                print(f"gputop: error: {a.file}: cannot format the report ({type(exc).__name__}: "
                      f"{_one_line(exc)}); `--json` has the figures", file=sys.stderr)
                continue
            sys.stdout.write(text)
        for cross in jobs:
            from gputop.diagnostics.trace.reporting.report import format_cross_rank

            sys.stdout.write("\n" + "=" * width + "\n\n" + format_cross_rank(cross, width))
    sys.stdout.flush()
    return 2 if failed else 0
