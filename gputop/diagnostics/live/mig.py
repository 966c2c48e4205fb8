"""The live rules on MIG devices: each MIG device is judged as a GPU of its own.

A MIG device is isolated from the others (its own SMs, memory and bandwidth), so a leak, a
full memory or processes sharing it concern that device, not the board: the rules see each
MIG device as a GPU (``mig_view.instance_gpu``), under a key of its own, and the whole GPU
without its processes and memory (they are the instances'). The findings then name the MIG device
("GPU 0 MIG 1g.10gb (GI 7)") and carry ``gpu`` = the board and ``gpu_instance`` = its GI.

Rules that read NVML utilization do not fire on MIG devices: NVML reports none there (the
SM activity GPM gives is another measure, and the rules' thresholds are utilization's).
"""

from __future__ import annotations

import re
from dataclasses import replace

from gputop.core.mig_view import instance_gpu, instance_label
from gputop.core.model import MigSample, Snapshot
from gputop.diagnostics import live
from gputop.diagnostics.findings import Finding, order_findings

MIG_KEY_BASE = 1 << 20  # far above any GPU index: the rules' keys for MIG devices


def mig_key(parent: int, gpu_instance: int) -> int:
    return MIG_KEY_BASE + parent * 1024 + gpu_instance


def expand(snap: Snapshot) -> tuple[Snapshot, dict[int, tuple[int, MigSample]]]:
    """The snapshot the rules read: each MIG device as a GPU; its keys."""
    keys: dict[int, tuple[int, MigSample]] = {}
    gpus = []
    for g in snap.gpus:
        if not (g.mig_mode and g.mig) or g.lost:
            gpus.append(g)
            continue
        # The board: its own physical readings; its memory and processes are the MIG
        # devices' (each has its own memory: the board cannot run out as a whole).
        gpus.append(replace(g, processes=(), mem_used=None, mem_total=None))
        for m in g.mig:
            key = mig_key(g.index, m.gpu_instance)
            keys[key] = (g.index, m)
            gpus.append(instance_gpu(g, m, key))
    return (replace(snap, gpus=tuple(gpus)) if keys else snap), keys


def relabel(f: Finding, keys: dict[int, tuple[int, MigSample]]) -> Finding:
    """A finding about a MIG device's key, told about the MIG device of its GPU."""
    if f.gpu not in keys:
        return f
    parent, m = keys[f.gpu]
    label = instance_label(parent, m)
    pattern = re.compile(rf"\bGPU {f.gpu}\b")

    def text(value: str) -> str:
        return pattern.sub(label, value).replace(f"-i {f.gpu}", f"-i {parent}")

    return replace(f, gpu=parent, gpu_instance=m.gpu_instance, title=text(f.title),
                   evidence=text(f.evidence), fix=text(f.fix), next_step=text(f.next_step))


class LiveDiagnosis(live.LiveDiagnosis):
    """``live.LiveDiagnosis`` that judges MIG devices one by one (the same otherwise)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._keys: dict[int, tuple[int, MigSample]] = {}

    def update(self, snap: Snapshot, evaluate: bool = True) -> list[live.Transition]:
        view, keys = expand(snap)
        self._keys.update(keys)  # kept: a finding may clear after its MIG device went
        return [replace(t, finding=relabel(t.finding, self._keys))
                for t in super().update(view, evaluate)]

    def findings(self) -> list[Finding]:
        return order_findings(relabel(f, self._keys) for f in super().findings())
