"""How a process's container, pod, Slurm job, pid namespace and MIG device are shown: the
process table, ``snapshot`` and the exporter's labels. Pure."""

from __future__ import annotations

from collections.abc import Callable

from gputop.core.format import safe_text
from gputop.core.model import Owner, ProcSample

# What a per-process cell says where the driver refuses the reading on a MIG device (it
# reports no per-process utilization there, and may hide per-process memory): never 0.
NA_MIG = "n/a (MIG)"
OWNER_LABELS = ("pod", "namespace", "container", "hpc_job")  # dcgm-exporter's names


def label_values(owner: Owner | None) -> dict[str, str]:
    """dcgm-exporter's labels for an owner: ``pod``, ``namespace``, ``container`` and
    ``hpc_job``; a pod without a readable name is named by its uid, a container by its short
    id."""
    if owner is None:
        return dict.fromkeys(OWNER_LABELS, "")
    container = owner.container or (owner.container_id[:12] if owner.container_id else "")
    return {"pod": owner.pod or owner.pod_uid or "", "namespace": owner.namespace or "",
            "container": container, "hpc_job": owner.slurm_job or ""}


def owner_text(owner: Owner | None) -> str:
    """A short tag: ``pod ns/name/container``, ``docker name``, ``slurm 1234``."""
    if owner is None:
        return ""
    labels = label_values(owner)
    parts = []
    if owner.pod or owner.pod_uid:
        parts.append("pod " + "/".join(
            x for x in (labels["namespace"], labels["pod"], labels["container"]) if x))
    elif labels["container"]:
        parts.append(f"{owner.runtime or 'container'} {labels['container']}")
    if owner.slurm_job:
        parts.append(f"slurm {owner.slurm_job}")
    if owner.slurm_claim:
        parts.append(f"claims slurm {owner.slurm_claim}")
    return safe_text(", ".join(parts))


def tags(proc: ProcSample) -> str:
    """What places the process: its MIG device, its other pid, its owner (may be empty)."""
    parts = []
    if proc.gpu_instance is not None:
        parts.append(f"MIG GI {proc.gpu_instance}")
    if proc.ns_pid is not None:
        parts.append(f"container pid {proc.ns_pid}")
    if proc.host_pid is not None:
        parts.append(f"host pid {proc.host_pid}")
    owner = owner_text(proc.owner)
    if owner:
        parts.append(owner)
    return " · ".join(parts)


def per_process(proc: ProcSample, value: float | int | None,
                text: Callable[[float | int | None], str]) -> str:
    """A per-process reading as text; "n/a (MIG)" where a MIG device gives none."""
    if value is None and proc.gpu_instance is not None:
        return NA_MIG
    return text(value)
