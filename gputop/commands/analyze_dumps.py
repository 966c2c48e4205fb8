"""`gputop analyze DIR` on Flight Recorder dumps: which rank hangs the job.

Called by commands/analyze.py for the arguments that hold dumps (told apart from profiler
traces by content, ``diagnostics.hang.folder``). Each folder is one job (one dump per rank);
dump files named one by one together are one job.
"""

from __future__ import annotations

import argparse
import os
import sys

from gputop.diagnostics.hang.dumps import MAX_DUMP_BYTES, rank_from_name
from gputop.diagnostics.hang.folder import dump_files, is_dump_file


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _dump_named(path: str) -> bool:
    """A file given by name that is not a trace: a rank number at the end and no .json."""
    name = os.path.basename(path)
    return rank_from_name(name) is not None and not name.endswith((".json", ".json.gz", ".gz"))


def split_dumps(paths: list[str]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """(jobs of dumps: [(label, files)], the other arguments: traces)."""
    jobs: list[tuple[str, list[str]]] = []
    loose: list[str] = []
    others: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = dump_files(path)
            if found:
                jobs.append((path, found))
            else:
                others.append(path)
        elif is_dump_file(path) or (os.path.isfile(path) and _dump_named(path)):
            loose.append(path)
        else:
            others.append(path)
    if loose:
        jobs.append((", ".join(loose) if len(loose) <= 3 else f"{len(loose)} dump files", loose))
    return jobs, others


def max_dump_bytes(args: argparse.Namespace) -> int:
    mb = getattr(args, "max_dump_mb", None)
    return MAX_DUMP_BYTES if mb is None else int(mb * 2**20)


def run_dumps(jobs: list[tuple[str, list[str]]], args: argparse.Namespace, width: int) -> bool:
    """Print each job's attribution (text, or one JSON object per job). True if any dump
    could not be read or analysed (each such dump got one line on stderr)."""
    from gputop.diagnostics.hang.attribution import attribute
    from gputop.diagnostics.hang.folder import load_dumps
    from gputop.diagnostics.hang.render import format_report

    failed = False
    for i, (label, files) in enumerate(jobs):
        loaded = load_dumps(files, max_bytes=max_dump_bytes(args))
        for error in loaded.errors:
            failed = True
            print(f"gputop: error: {_one_line(error)}", file=sys.stderr)
        if not loaded.dumps:
            failed = True
            if not loaded.errors:  # else each dump has had its line: one line per bad dump
                print(f"gputop: error: {label}: no readable Flight Recorder dump",
                      file=sys.stderr)
            continue
        try:
            report = attribute(loaded.dumps)
        except Exception as exc:  # a dump shape we did not foresee: one line, not a traceback
            failed = True
            print(f"gputop: error: {label}: cannot attribute ({type(exc).__name__}: "
                  f"{_one_line(exc)}); please report these dumps", file=sys.stderr)
            continue
        if args.json:
            import msgspec

            from gputop.format import json_safe

            data = report.to_json()
            data["source"] = label
            data["notes"] = loaded.notes + data["notes"]
            sys.stdout.write(json_safe(msgspec.json.encode(data)).decode() + "\n")
        else:
            if i:
                sys.stdout.write("\n" + "=" * width + "\n\n")
            from gputop.format import safe_text

            sys.stdout.write(f"{safe_text(label)}\n")
            for note in loaded.notes:
                sys.stdout.write(f"note: {safe_text(note)}\n")
            sys.stdout.write(format_report(report, width=width))
    return failed
