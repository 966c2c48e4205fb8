"""An agent's ``status`` reply, checked once where the monitor reads it.

The agent runs in someone else's process: whatever it says is a claim. ``parse_status`` turns
the reply into a typed ``AgentStatus`` with every number checked against its meaning (shares
0-1, counters non-negative and never going back for the same process, durations positive and
finite, rates and FLOPs bounded). A value out of range is dropped (None) and its name counted in
``rejected``; nothing downstream (the TUI, ``snapshot``, the exporter, recordings) sees it.
``AgentStatus.to_dict()`` is what the Sampler puts in ``ProcSample.agent``: the checked reply,
with ``"rejected"`` naming what was dropped (visible in ``snapshot --json``).

Monitor side only: ``gputop.client`` (the training process never imports it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from gputop.validate import AGE, COUNT, RATE, RATIO, SECONDS, number

MAX_FLOPS_PER_STEP = 1e21  # far beyond any model's step; keeps a hostile number finite
MAX_SAMPLES = 1e9
MAX_RANK = 1 << 20
MAX_JOB_ID = 128
GOODPUT_TOLERANCE = 0.05  # the ledger's share against its own seconds (rounding: 4 decimals)
GOODPUT_KEYS = ("productive", "startup", "dataloader", "capture", "checkpoint", "stall", "hang")
_JOB_ID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, no spaces: a label's value

# Top-level numbers of the reply and what each must be: (low, high, integer).
_TOP: dict[str, tuple[float, float, bool]] = {
    "steps": (*COUNT, True),
    "steps_per_s": (*RATE, False),
    "step_time_p50_s": (*SECONDS, False),
    "step_time_p95_s": (*SECONDS, False),
    "dataloader_wait_share": (*RATIO, False),
    "sync_wait_share": (*RATIO, False),
    "host_busy_share": (*RATIO, False),
    "window_steps": (*COUNT, True),
    "last_step_age_s": (*AGE, False),
    "rank": (0, MAX_RANK, True),
    "local_rank": (0, MAX_RANK, True),
    "world_size": (1, MAX_RANK, True),
    "local_world_size": (1, MAX_RANK, True),
    "pid": (1, 1 << 31, True),
    "ppid": (0, 1 << 31, True),
    "start_time": (1e-9, 253402300800.0, False),
    "agent_errors": (*COUNT, True),
    "refused_peers": (*COUNT, True),
}
_GOODPUT: dict[str, tuple[float, float, bool]] = {
    "goodput": (*RATIO, False),
    "in_step_s": (*AGE, False),
    "wall_s": (*AGE, False),
    "typical_step_s": (*SECONDS, False),
    "best_window_steps_per_s": (*RATE, False),
    "best_window_s": (*SECONDS, False),
    "best_window_age_s": (*AGE, False),
}


@dataclass(frozen=True)
class AgentStatus:
    """The checked figures of one reply (None: absent or rejected) and the reply itself with
    the rejected values set to None (``to_dict``)."""

    pid: int | None = None
    steps: int | None = None
    steps_per_s: float | None = None
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    dataloader_wait_share: float | None = None
    rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    goodput: float | None = None
    goodput_seconds: dict[str, float] = field(default_factory=dict)
    flops_per_step: float | None = None
    rejected: tuple[str, ...] = ()
    checked: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.checked)
        if self.rejected:
            out["rejected"] = list(self.rejected)
        return out


def _check(data: dict[str, Any], rules: dict[str, tuple[float, float, bool]], prefix: str,
           rejected: list[str]) -> None:
    for key, (low, high, integer) in rules.items():
        value = data.get(key)
        if value is None:
            continue
        good = number(value, low, high, integer=integer)
        if good is None:
            rejected.append(prefix + key)
        data[key] = good


def _goodput(ledger: Any, rejected: list[str]) -> dict[str, Any] | None:
    if ledger is None:
        return None
    if not isinstance(ledger, dict):
        rejected.append("goodput")
        return None
    ledger = dict(ledger)
    _check(ledger, _GOODPUT, "goodput.", rejected)
    seconds = ledger.get("seconds")
    if seconds is not None:
        clean: dict[str, float] = {}
        if isinstance(seconds, dict):
            for key in GOODPUT_KEYS:
                value = seconds.get(key)
                if value is None:
                    continue
                good = number(value, 0.0, 1e10)
                if good is None:
                    rejected.append(f"goodput.seconds.{key}")
                else:
                    clean[key] = float(good)
        else:
            rejected.append("goodput.seconds")
        ledger["seconds"] = clean
        total = sum(clean.values())
        share = ledger.get("goodput")
        # The share is the ledger's productive seconds over those booked: one that disagrees
        # with its own seconds ("goodput 100%" beside "stalls 50% · hangs 50%") is not believed.
        if share is not None and total > 0 and \
                abs(share - clean.get("productive", 0.0) / total) > GOODPUT_TOLERANCE:
            rejected.append("goodput.goodput")
            ledger["goodput"] = None
    return ledger


def _flops(flops: Any, rejected: list[str]) -> dict[str, Any] | None:
    if flops is None:
        return None
    if not isinstance(flops, dict):
        rejected.append("flops")
        return None
    flops = dict(flops)
    last = flops.get("last")
    if isinstance(last, dict):
        last = dict(last)
        _check(last, {"flops_per_step": (0.0, MAX_FLOPS_PER_STEP, False),
                      "samples_per_step": (1, MAX_SAMPLES, True)}, "flops.last.", rejected)
        flops["last"] = last
    elif last is not None:
        rejected.append("flops.last")
        flops["last"] = None
    return flops


def parse_status(reply: dict[str, Any], last_steps: int | None = None) -> AgentStatus:
    """Check one ``status`` reply. ``last_steps``: the step count this process reported
    before (a counter never goes back: a lower one is rejected)."""
    data = dict(reply)
    rejected: list[str] = []
    _check(data, _TOP, "", rejected)
    steps = data.get("steps")
    if steps is not None and last_steps is not None and steps < last_steps:
        rejected.append("steps (went back)")
        data["steps"] = steps = None
    p50, p95 = data.get("step_time_p50_s"), data.get("step_time_p95_s")
    if p50 is not None and p95 is not None and p95 < p50:
        rejected.append("step_time_p95_s")  # a 95th percentile below the median
        data["step_time_p95_s"] = None
    job = data.get("job_id")
    if job is not None and not (isinstance(job, (str, int)) and not isinstance(job, bool)
                                and _JOB_ID.match(str(job))):
        rejected.append("job_id")
        data["job_id"] = job = None
    if "goodput" in data:
        data["goodput"] = _goodput(data["goodput"], rejected)
    if "flops" in data:
        data["flops"] = _flops(data["flops"], rejected)
    ledger = data.get("goodput") or {}
    last = (data.get("flops") or {}).get("last") or {}
    return AgentStatus(
        pid=data.get("pid"), steps=steps, steps_per_s=data.get("steps_per_s"),
        step_time_p50_s=data.get("step_time_p50_s"),
        step_time_p95_s=data.get("step_time_p95_s"),
        dataloader_wait_share=data.get("dataloader_wait_share"), rank=data.get("rank"),
        world_size=data.get("world_size"), job_id=None if job is None else str(job),
        goodput=ledger.get("goodput"), goodput_seconds=dict(ledger.get("seconds") or {}),
        flops_per_step=last.get("flops_per_step") if isinstance(last, dict) else None,
        rejected=tuple(rejected), checked=data)


def check_achieved(achieved: float | None, peak: float | None) -> bool:
    """Whether FLOP/s a process claims can be real: below its device's peak times a margin
    (or below what any one device can do, where the peak is unknown)."""
    from gputop.validate import MAX_DEVICE_FLOPS, PEAK_MARGIN

    if achieved is None:
        return True
    if not math.isfinite(achieved) or achieved < 0:
        return False
    return achieved <= (peak * PEAK_MARGIN if peak else MAX_DEVICE_FLOPS)
