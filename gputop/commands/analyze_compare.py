"""`gputop analyze --compare BASE NEW`: what changed between two traces of one job.

Each side is a trace, a folder of traces (tensorboard_trace_handler's, one per rank or step;
a capture's folder), or a recording whose ``captures/`` folder holds its capture's traces.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gputop.core.errors import UsageError
from gputop.diagnostics.trace.loading.folder import traces_in


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def side_traces(path: str) -> list[str]:
    """The traces of one side (raises UsageError when it has none)."""
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file or folder", exit_code=2)
        return [path]
    found = traces_in(path)
    captures = os.path.join(path, "captures")
    if not found and os.path.isdir(captures):
        found = traces_in(captures)
    if not found:
        raise UsageError(f"{path}: no trace in this folder (*.json, *.json.gz, or captures/)",
                         exit_code=2)
    return found


def compare_paths(base: str, new: str, limits: Any) -> dict[str, Any]:
    """The comparison of two sides (raises UsageError with one line when one cannot be read)."""
    from gputop.diagnostics.trace.analysis import TraceError, analyze_trace
    from gputop.diagnostics.trace.reporting.compare import compare

    sides = []
    for path in (base, new):
        analyses = []
        for trace in side_traces(path):
            try:
                analyses.append(analyze_trace(trace, limits))
            except TraceError as exc:
                raise UsageError(_one_line(exc), exit_code=2) from None
            except MemoryError:
                raise UsageError(f"{trace}: not enough memory to analyse it",
                                 exit_code=2) from None
        sides.append(analyses)
    return compare(sides[0], sides[1])


def run_compare(args: Any, limits: Any, width: int) -> int:
    base, new = args.compare
    result = compare_paths(base, new, limits)
    if args.json:
        import msgspec

        from gputop.core.format import json_safe

        sys.stdout.write(json_safe(msgspec.json.encode(result)).decode() + "\n")
    else:
        from gputop.diagnostics.trace.reporting.compare import format_compare

        sys.stdout.write(format_compare(result, width))
    sys.stdout.flush()
    return 0
