"""An agent's ``status`` reply, checked once where the monitor reads it.

The agent runs in someone else's process: whatever it says is a claim. ``parse_status`` turns
the reply into a typed ``AgentStatus`` with every number checked against its meaning (shares
0-1, counters non-negative and never going back for the same process, durations positive and
finite, rates and FLOPs bounded). A value out of range is dropped (None) and its name counted in
``rejected``; nothing downstream (the TUI, ``snapshot``, the exporter, recordings) sees it.
The ``AgentStatus`` is what the Sampler puts in ``ProcSample.agent``, read by attribute
everywhere after; ``to_dict()`` is its JSON form, with ``"rejected"`` naming what was dropped
(visible in ``snapshot --json``).

Monitor side only: ``gputop.client`` (the training process never imports it).
"""

from __future__ import annotations

import math
import re
from typing import Any

from gputop.core.validate import AGE, COUNT, RATE, RATIO, SECONDS, number

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


class AgentStatus:
    """One agent's checked status, read by attribute: every number of ``_TOP`` (None where it
    was absent or rejected), ``job_id``, ``argv``, the nested ledgers as their checked dicts
    (``goodput_ledger``, ``flops``, ``compile``, read by ``gputop.core.efficiency`` and
    ``gputop.core.compile_health``), and ``rejected``: the names of what was dropped.
    ``to_dict()`` is the JSON form (``snapshot --json``, recordings, the fleet's stream), which
    ``parse_status`` reads back through the same checks.

    A plain class, not a dataclass: msgspec hands the raw JSON object to ``decode_hook`` when a
    snapshot is decoded, so a node's or a recording's agent goes through ``parse_status`` too."""

    __slots__ = (*_TOP, "host_pid", "job_id", "argv", "goodput", "goodput_ledger", "goodput_seconds",
                 "flops", "flops_per_step", "compile", "checkpoint_s", "rejected", "_checked")

    pid: int | None
    ppid: int | None
    steps: int | None
    steps_per_s: float | None
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    dataloader_wait_share: float | None
    sync_wait_share: float | None
    host_busy_share: float | None
    window_steps: int | None
    last_step_age_s: float | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    start_time: float | None
    agent_errors: int | None
    refused_peers: int | None
    host_pid: int | None
    job_id: str | None
    argv: tuple[str, ...]
    goodput: float | None  # the ledger's productive share
    goodput_ledger: dict[str, Any] | None
    goodput_seconds: dict[str, float]
    flops: dict[str, Any] | None
    flops_per_step: float | None
    compile: dict[str, Any] | None
    checkpoint_s: float | None  # how long the checkpoint being written has taken
    rejected: tuple[str, ...]
    _checked: dict[str, Any]

    def __init__(self, checked: dict[str, Any], rejected: tuple[str, ...] = ()) -> None:
        for key in _TOP:
            object.__setattr__(self, key, checked.get(key))
        job = checked.get("job_id")
        ledger = checked.get("goodput") if isinstance(checked.get("goodput"), dict) else None
        flops = checked.get("flops") if isinstance(checked.get("flops"), dict) else None
        last = (flops or {}).get("last")
        compiled = checked.get("compile")
        argv = checked.get("argv")
        values = {
            "job_id": None if job is None else str(job),
            "argv": tuple(a for a in argv if isinstance(a, str)) if isinstance(argv, list)
            else (),
            "goodput_ledger": ledger,
            "goodput": (ledger or {}).get("goodput"),
            "goodput_seconds": dict((ledger or {}).get("seconds") or {}),
            "flops": flops,
            "flops_per_step": last.get("flops_per_step") if isinstance(last, dict) else None,
            "compile": compiled if isinstance(compiled, dict) else None,
            "checkpoint_s": checked.get("checkpoint_s"),
            "host_pid": checked.get("host_pid"),
            "rejected": tuple(rejected),
            "_checked": checked,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("AgentStatus is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AgentStatus) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.pid, self.steps, self.rejected))

    def __repr__(self) -> str:
        return f"AgentStatus(pid={self.pid}, steps={self.steps}, rank={self.rank}, " \
               f"rejected={list(self.rejected)})"

    def __copy__(self) -> AgentStatus:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> AgentStatus:
        return self  # read-only: a copy would be the same

    def __reduce__(self) -> tuple[Any, ...]:
        return (AgentStatus, (self._checked, self.rejected))

    def to_dict(self) -> dict[str, Any]:
        out = dict(self._checked)
        if self.rejected:
            out["rejected"] = list(self.rejected)
        return out


def decode_hook(kind: type, raw: Any) -> Any:
    """msgspec's ``dec_hook`` for a snapshot's ``agent``: the raw object through
    ``parse_status``, as a local agent's reply is."""
    if kind is AgentStatus:
        if not isinstance(raw, dict):
            return AgentStatus({}, ("agent",))
        raw = {k: v for k, v in raw.items() if k != "rejected"}  # recomputed here
        return parse_status(raw)
    raise NotImplementedError(f"no decoding for {kind}")


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


# torch.compile's status (read into a CompileHealth by gputop.core.compile_health).
MAX_COMPILED_FUNCTIONS = 16
COMPILES = (0, 2**31 - 1)  # a compile takes milliseconds at least: more is no real count
LINES = (1, 10**7 - 1)
# The compile status's numbers and what each must be: (low, high, integer).
_TOTALS: dict[str, tuple[float, float, bool]] = {
    "compiles": (*COMPILES, True), "recompiles": (*COMPILES, True),
    "fallbacks": (*COMPILES, True), "graph_breaks": (*COMPILES, True),
    "compile_s": (*AGE, False), "blocked_after_warmup_s": (*AGE, False),
}
_FUNCTION: dict[str, tuple[float, float, bool]] = {
    "compiles": (*COMPILES, True), "recompiles": (*COMPILES, True), "line": (*LINES, True),
}


def _refused(data: dict[str, Any], rules: dict[str, tuple[float, float, bool]]) -> list[str]:
    """The fields of ``data`` present but not a number in their range."""
    return [key for key, (low, high, integer) in rules.items()
            if data.get(key) is not None and number(data[key], low, high, integer) is None]


def check_compile(data: Any) -> tuple[Any, list[str]]:
    """The agent's ``compile`` status with each refused figure set to None, and their names
    (``compile.compile_s``, ``compile.functions.2.line``) for ``rejected``."""
    if not isinstance(data, dict):
        return None, [] if data is None else ["compile"]
    data = dict(data)
    names = []
    for key in _refused(data, _TOTALS):
        data[key] = None
        names.append(f"compile.{key}")
    graphs = data.get("cudagraph")
    if isinstance(graphs, dict) and _refused(graphs, {"rerecords": (*COMPILES, True)}):
        data["cudagraph"] = {**graphs, "rerecords": None}
        names.append("compile.cudagraph.rerecords")
    raw = data.get("functions")
    if isinstance(raw, list):
        functions = []
        for i, f in enumerate(raw[:MAX_COMPILED_FUNCTIONS]):
            bad = _refused(f, _FUNCTION) if isinstance(f, dict) else []
            if bad:
                f = {**f, **dict.fromkeys(bad)}
                names.extend(f"compile.functions.{i}.{key}" for key in bad)
            functions.append(f)
        data["functions"] = functions
    return data, names


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
    if data.get("checkpoint_s") is not None:
        data["checkpoint_s"] = number(data["checkpoint_s"], 0.0, AGE[1])
        if data["checkpoint_s"] is None:
            rejected.append("checkpoint_s")
    host_pid = data.get("host_pid")
    if host_pid is not None and number(host_pid, 1, 1 << 31, integer=True) is None:
        rejected.append("host_pid")
        data["host_pid"] = None
    argv = data.get("argv")
    if argv is not None and not isinstance(argv, list):
        rejected.append("argv")
        data["argv"] = None
    if "compile" in data:  # torch.compile's figures: the same rule
        data["compile"], refused = check_compile(data["compile"])
        rejected.extend(refused)
    return AgentStatus(data, tuple(rejected))


def check_achieved(achieved: float | None, peak: float | None) -> bool:
    """Whether FLOP/s a process claims can be real: below its device's peak times a margin
    (or below what any one device can do, where the peak is unknown)."""
    from gputop.core.validate import MAX_DEVICE_FLOPS, PEAK_MARGIN

    if achieved is None:
        return True
    if not math.isfinite(achieved) or achieved < 0:
        return False
    return achieved <= (peak * PEAK_MARGIN if peak else MAX_DEVICE_FLOPS)
