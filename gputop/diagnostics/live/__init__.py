"""Live rules: findings from windows of snapshots (NVML + psutil + agent telemetry).

Pure functions of the recent snapshots: no textual, no pynvml, no torch. ``LiveDiagnosis``
(``hysteresis``) keeps the windows (``windows``), evaluates every rule on each new snapshot and
raises a finding only after its condition has held. One module per family of causes:

* ``input``: the input pipeline (``dataloader-stall``);
* ``host``: the GPU waits on the host (``host-bound``, ``launch-bound``, ``host-sync``);
* ``pcie``: the host link (``pcie-bound``; link capacities in ``links``);
* ``idle``: nothing to do (``gpu-idle``, ``hung``);
* ``hardware``: the board (``throttling``, ``hardware-errors``);
* ``memory``: ``memory-pressure``, ``memory-growth``;
* ``sharing``: ``contention``, ``imbalance`` (the agents' cross-rank view in ``ranks``);
* ``causes``: every rule, and one root cause per GPU; ``startup``: no cause while a job starts;
  ``load``: where a training process spends its time; ``common``: thresholds and helpers.
"""

from gputop.diagnostics.live.causes import (
    ROOT_CAUSES,
    RULES,
    arbitrate,
    evaluate,
    evaluate_windows,
)
from gputop.diagnostics.live.common import (
    CRITICAL_SHARE,
    HUNG_S,
    KEEP_S,
    MEMORY_CRITICAL_S,
    MEMORY_MIN_S,
    MEMORY_WINDOW_S,
    WARNING_SHARE,
    WINDOW_S,
    severity_for,
)
from gputop.diagnostics.live.hysteresis import LiveDiagnosis, Transition
from gputop.diagnostics.live.startup import STARTUP_MAX_S
from gputop.diagnostics.live.windows import _linear_fit, _RunningFit, _Windows

__all__ = [
    "CRITICAL_SHARE",
    "HUNG_S",
    "KEEP_S",
    "MEMORY_CRITICAL_S",
    "MEMORY_MIN_S",
    "MEMORY_WINDOW_S",
    "ROOT_CAUSES",
    "RULES",
    "STARTUP_MAX_S",
    "WARNING_SHARE",
    "WINDOW_S",
    "LiveDiagnosis",
    "Transition",
    "_RunningFit",
    "_Windows",
    "_linear_fit",
    "arbitrate",
    "evaluate",
    "evaluate_windows",
    "severity_for",
]
