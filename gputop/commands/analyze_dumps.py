"""`gputop analyze DIR` on Flight Recorder dumps: which rank hangs the job.

Called by commands/analyze.py for the arguments that hold dumps (told apart from profiler
traces by content, ``diagnostics.hang.folder``). Each folder is one job (one dump per rank);
dump files named one by one together are one job.
"""

from __future__ import annotations

import argparse
import os
import sys

from gputop.diagnostics.hang.debug_server import newest_stacks
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
            stacks = None if found else newest_stacks(path)
            if found:
                jobs.append((path, found))
            elif stacks:  # a Debug Server dump_dir: its newest stacks_*.txt
                jobs.append((path, [stacks]))
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
        if len(files) == 1 and newest_stacks(os.path.dirname(files[0]) or ".") == files[0]:
            failed |= _debug_server(label, files[0], args, width, first=not i)
            continue
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

            from gputop.core.format import json_safe

            data = report.to_json()
            data["source"] = label
            data["notes"] = loaded.notes + data["notes"]
            sys.stdout.write(json_safe(msgspec.json.encode(data)).decode() + "\n")
        else:
            if i:
                sys.stdout.write("\n" + "=" * width + "\n\n")
            from gputop.core.format import safe_text

            sys.stdout.write(f"{safe_text(label)}\n")
            for note in loaded.notes:
                sys.stdout.write(f"note: {safe_text(note)}\n")
            sys.stdout.write(format_report(report, width=width))
    return failed


def _debug_server(label: str, path: str, args: argparse.Namespace, width: int,
                  first: bool) -> bool:
    """A Debug Server dump_dir: the hang its newest stacks file tells. True on an error."""
    from gputop.core.format import safe_text
    from gputop.diagnostics.hang.debug_server import StacksError, attribute_stacks, read_stacks
    from gputop.diagnostics.hang.render import format_report

    try:
        ranks = read_stacks(path)
        dumped_at = os.stat(path).st_mtime
    except (StacksError, OSError) as exc:
        print(f"gputop: error: {_one_line(exc)}", file=sys.stderr)
        return True
    if not ranks:
        print(f"gputop: error: {path}: no rank's stack in it (not a Debug Server stacks file)",
              file=sys.stderr)
        return True
    report = attribute_stacks(ranks, path, dumped_at)
    if args.json:
        import msgspec

        from gputop.core.format import json_safe

        data = report.to_json()
        data.update(kind="debug-server-stacks", source=label, stacks_file=path)
        sys.stdout.write(json_safe(msgspec.json.encode(data)).decode() + "\n")
        return False
    if not first:
        sys.stdout.write("\n" + "=" * width + "\n\n")
    sys.stdout.write(f"{safe_text(label)} (PyTorch Debug Server: {safe_text(os.path.basename(path))})\n")
    sys.stdout.write(format_report(report, width=width).replace(
        "Flight Recorder:", "Debug Server stacks:", 1))
    return False
