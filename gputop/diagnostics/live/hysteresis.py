"""Findings that do not flap: raise after holding, clear after being absent.

``LiveDiagnosis`` takes snapshots in time order (the live sampler's, or a recording's: the
windows run on the snapshots' own clock), evaluates every rule on each, and raises a finding
only after its condition has held for ``raise_after`` seconds, and clears it only after the
condition has been absent for ``clear_after`` seconds. A sample stands for the interval up to
it: a condition seen in the samples at t0, t0 + 1 s, ... t0 + 3 s has held 4 s (so a sampling
clock a few microseconds early does not cost a whole interval).
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.core.model import Snapshot
from gputop.diagnostics.findings import Finding, finding_key, order_findings
from gputop.diagnostics.live.causes import ROOT_CAUSES, _group, evaluate_windows
from gputop.diagnostics.live.common import WINDOW_S
from gputop.diagnostics.live.windows import _Windows


@dataclass(frozen=True)
class Transition:
    state: str  # "raised" | "cleared"
    time: float
    finding: Finding

    def to_json(self, host: str) -> dict:
        data = {"time": self.time, "host": host, "state": self.state, **self.finding.to_json()}
        for key in ("gpu", "pid", "job", "rank"):
            data.setdefault(key, None)
        return data


class LiveDiagnosis:
    """Feed snapshots in time order; get raise/clear transitions and the active findings."""

    def __init__(self, raise_after: float = 4.0, clear_after: float = 10.0,
                 own_pid: int | None = None) -> None:
        self.raise_after = raise_after
        self.clear_after = clear_after
        self.own_pid = own_pid
        # What the rules read, updated one snapshot at a time (no copy of the history).
        self._windows = _Windows()
        self._pending: dict[tuple, float] = {}  # key -> first time the condition held
        self._absent: dict[tuple, float] = {}  # active key -> first time it did not hold
        self.active: dict[tuple, Finding] = {}
        self._last_time: float | None = None  # the previous snapshot's

    def update(self, snap: Snapshot, evaluate: bool = True) -> list[Transition]:
        """Take ``snap`` into the windows; with ``evaluate``, run the rules on them too (a
        caller may run them less often than it samples: the windows hold every snapshot)."""
        self._windows.add(snap)
        now = snap.time
        # What the newest sample stands for (bounded: a gap in sampling is not a hold).
        step = 0.0 if self._last_time is None else min(WINDOW_S, max(0.0, now - self._last_time))
        self._last_time = now
        if not evaluate:
            return []
        current = {finding_key(f): f for f in evaluate_windows(self._windows, self.own_pid)}
        transitions: list[Transition] = []
        for key, finding in current.items():
            self._absent.pop(key, None)
            if key in self.active:
                self.active[key] = finding  # fresh evidence
                continue
            since = self._pending.setdefault(key, now)
            if now - since + step >= self.raise_after:
                if finding.id in ROOT_CAUSES:
                    # A new root cause for this GPU replaces the old one at once: never two.
                    for other_key, other in list(self.active.items()):
                        if other.id in ROOT_CAUSES and _group(other) == _group(finding):
                            transitions.append(Transition("cleared", now, other))
                            del self.active[other_key]
                            self._absent.pop(other_key, None)
                self.active[key] = finding
                del self._pending[key]
                transitions.append(Transition("raised", now, finding))
        for key in list(self._pending):
            if key not in current:
                del self._pending[key]
        for key in list(self.active):
            if key in current:
                continue
            since = self._absent.setdefault(key, now)
            if now - since + step >= self.clear_after:
                transitions.append(Transition("cleared", now, self.active.pop(key)))
                del self._absent[key]
        return transitions

    def findings(self) -> list[Finding]:
        return order_findings(self.active.values())
