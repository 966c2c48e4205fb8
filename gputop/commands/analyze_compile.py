"""`gputop analyze LOG|DIR` on torch.compile's structured logs (TORCH_TRACE): recompiles,
graph breaks, fallbacks to eager, compile time, and collective schedules that differ between
ranks.

Called by commands/analyze.py for the arguments that hold such logs (told apart from profiler
traces by content, ``diagnostics.compile_log.read.is_compile_log``). A folder is one job (one
log per rank, ``dedicated_log_torch_trace_rank_N_*.log``); logs named one by one together are
one job.
"""

from __future__ import annotations

import argparse
import os
import sys

from gputop.diagnostics.compile_log.read import is_compile_log

MAX_FILES = 4096  # logs read from one folder (one per rank)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def logs_in(folder: str) -> list[str]:
    try:
        names = sorted(e.name for e in os.scandir(folder)
                       if not e.name.startswith(".") and e.is_file(follow_symlinks=False))
    except OSError:
        return []
    return [p for p in (os.path.join(folder, n) for n in names[:MAX_FILES]) if is_compile_log(p)]


def split_compile_logs(paths: list[str]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """(jobs of compile logs: [(label, files)], the other arguments)."""
    jobs: list[tuple[str, list[str]]] = []
    loose: list[str] = []
    others: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = logs_in(path)
            if found:
                jobs.append((path, found))
            else:
                others.append(path)
        elif os.path.isfile(path) and is_compile_log(path):
            loose.append(path)
        else:
            others.append(path)
    if loose:
        jobs.append((", ".join(loose) if len(loose) <= 3 else f"{len(loose)} logs", loose))
    return jobs, others


def run_compile_logs(jobs: list[tuple[str, list[str]]], args: argparse.Namespace,
                     width: int) -> bool:
    """Print each job's report (text, or one JSON object per job). True if any log could
    not be read (each got one line on stderr)."""
    from gputop.diagnostics.compile_log.parse import parse_log
    from gputop.diagnostics.compile_log.read import CompileLogError
    from gputop.diagnostics.compile_log.report import build, format_text

    failed = False
    for i, (label, files) in enumerate(jobs):
        logs = []
        for path in files:
            try:
                logs.append(parse_log(path))
            except CompileLogError as exc:
                failed = True
                print(f"gputop: error: {_one_line(exc)}", file=sys.stderr)
            except MemoryError:
                failed = True
                print(f"gputop: error: {path}: not enough memory to read it", file=sys.stderr)
        if not logs:
            continue
        logs.sort(key=lambda g: (g.rank is None, g.rank or 0, g.path))
        try:
            report = build(label, logs)
        except Exception as exc:  # a log shape nobody foresaw: one line, never a traceback
            failed = True
            print(f"gputop: error: {label}: cannot analyse ({type(exc).__name__}: "
                  f"{_one_line(exc)[:200]}); please report this log", file=sys.stderr)
            continue
        if args.json:
            import msgspec

            from gputop.core.format import json_safe

            data = {k: v for k, v in report.items() if not k.startswith("_")}
            sys.stdout.write(json_safe(msgspec.json.encode(data)).decode() + "\n")
        else:
            if i:
                sys.stdout.write("\n" + "=" * width + "\n\n")
            sys.stdout.write(format_text(report, width))
    return failed
