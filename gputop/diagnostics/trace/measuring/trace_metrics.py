"""``TraceMetrics``: what the measuring stage finds in one trace, and what the rules and the report
read. Its own module so the measures that fill it and the assembly that builds it both import it
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from gputop.diagnostics.trace.measuring.gaps import Attribution, label_pieces
from gputop.diagnostics.trace.measuring.host import ThreadStates
from gputop.diagnostics.trace.measuring.intervals import Ranges
from gputop.diagnostics.trace.measuring.steps import Step


@dataclass
class TraceMetrics:
    """Everything the rules and the report need. ``to_json`` is the stable, serialisable part;
    ``ranges``, ``attribution`` and ``states`` are internal (interval sets, and what each host
    thread was doing, to name it in evidence)."""

    path: str
    gpu_present: bool
    vendor: str | None
    devices: list
    rank: int | None
    world_size: int | None
    steps: list[Step]
    step_source: str
    window: tuple[float, float]
    roles_ms: dict[str, float] = field(default_factory=dict)
    per_step_roles_ms: list[dict[str, float]] = field(default_factory=list)
    assessed: list[str] = field(default_factory=list)
    not_assessed: list[str] = field(default_factory=list)
    values: dict = field(default_factory=dict)
    ranges: dict[str, Ranges] = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    attribution: Attribution | None = None
    states: dict[object, ThreadStates] = field(default_factory=dict)
    has_host: bool = True
    # Why a trace with no GPU activity is a GPU program's (``measuring/unrecorded.py``): only its
    # host is assessed. None for GPU traces and CPU jobs.
    gpu_unrecorded: str | None = None

    @property
    def step_total_ms(self) -> float:
        return self.roles_ms.get("total", 0.0)

    def to_json(self) -> dict:
        out = dict(self.values)
        out["assessed"] = list(self.assessed)
        out["not_assessed"] = list(self.not_assessed)
        return out

    def top_labels(self, cause: str, limit: int = 3) -> list[tuple[str, float]]:
        """What the launching threads were doing in ``cause``'s idle time: (label, ms)."""
        if self.attribution is None:
            return []
        cache = self.details.setdefault("_labels", {})
        if cause not in cache:
            n = max(1, len(self.details.get("primary_devices", [])) or 1)
            cache[cause] = [(label, us / 1e3 / n) for label, us in
                            label_pieces(self.attribution, self.states, cause)]
        return cache[cause][:limit]
