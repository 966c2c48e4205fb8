"""The printed form of the live findings as they raise and clear: one text block or one JSON
object per transition. `gputop watch` prints them as it samples; `gputop replay` prints the
same lines for a recording."""

from __future__ import annotations

import json
import time

from gputop.core.format import safe_text
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.hysteresis import Transition


def _place(f: Finding) -> str:
    return " ".join(x for x in (f"GPU {f.gpu}" if f.gpu is not None else "",
                                f"pid {f.pid}" if f.pid is not None else "") if x)


def format_transition(t: Transition) -> str:
    f = t.finding
    stamp = time.strftime("%H:%M:%S", time.localtime(t.time))
    where = _place(f)
    if t.state == "cleared":
        return f"{stamp} cleared  {f.id} {where}: {f.title}"
    return (f"{stamp} RAISED   {f.severity} {f.id} {where}: {f.title}\n"
            f"         evidence: {f.evidence}\n"
            f"         fix: {f.fix}\n"
            f"         next: {f.next_step}")


def format_where(f: Finding, when: float) -> str:
    """The line printed when an active finding's "where" becomes known (after its raise)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(when))
    return f"{stamp} where    {f.id} {_place(f)}: {safe_text(f.where)}"


def transition_line(t: Transition, host: str, as_json: bool) -> str:
    """What `watch` and `replay` print for a transition (``--json``: one object per line)."""
    return json.dumps(t.to_json(host)) if as_json else format_transition(t)
