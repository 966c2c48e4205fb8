"""How a finding's severity shows: a glyph that survives NO_COLOR, and the worst per target."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gputop.diagnostics.findings import SEVERITY_RANK

SEVERITY_MARK: Mapping[str, str] = {"critical": "‼", "warning": "⚠", "info": "ℹ"}


def worst_severity(findings: Iterable, target: Callable[[object], int | None]) -> dict[int, str]:
    """target -> the most severe severity among ``findings`` about it (None targets skipped)."""
    worst: dict[int, str] = {}
    for f in findings:
        key = target(f)
        if key is None:
            continue
        if SEVERITY_RANK.get(f.severity, -1) > SEVERITY_RANK.get(worst.get(key, ""), -1):
            worst[key] = f.severity
    return worst
