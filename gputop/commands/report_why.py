"""Why `gputop report --baseline` failed on step times: the compare of both recordings'
capture traces (``RECORDING/captures/``: where ``gputop capture PID --out REC/captures`` puts
them), printed under the gate's verdict."""

from __future__ import annotations

import sys
from pathlib import Path


def capture_traces(recording: Path) -> list[str]:
    from gputop.commands.analyze_compare import traces_in

    captures = recording / "captures"
    return traces_in(str(captures)) if captures.is_dir() else []


def explain(current: Path, baseline: Path, width: int = 100) -> bool:
    """Print (on stderr, beside the verdict) what changed between the baseline's captures and
    the current recording's. False, printing nothing, when either has none."""
    if not (baseline.is_dir() and capture_traces(baseline) and capture_traces(current)):
        return False
    from gputop.commands.analyze_compare import compare_paths
    from gputop.core.errors import UsageError
    from gputop.diagnostics.trace.loading.load import DEFAULT_LIMITS
    from gputop.diagnostics.trace.reporting.compare import format_compare

    try:
        result = compare_paths(str(baseline / "captures"), str(current / "captures"),
                               DEFAULT_LIMITS)
    except UsageError as exc:
        print(f"gputop: cannot compare the captures: {exc}", file=sys.stderr)
        return False
    text = format_compare(result, width)
    print("gputop: why, from the recordings' captures (BASE = the baseline, NEW = this "
          "recording):", file=sys.stderr)
    sys.stderr.write("".join(f"  {line}\n" for line in text.splitlines()))
    return True
