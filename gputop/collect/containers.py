"""Who owns a process: its container, Kubernetes pod and Slurm job, from what Linux shows.

Read without privileges beyond the process's own user (root for other users' processes):

* ``/proc/PID/cgroup``: the container runtime's scope (``docker-<id>.scope``,
  ``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``libpod-<id>.scope``, ``/docker/<id>``),
  Kubernetes' pod slice (``kubepods-...-pod<uid>.slice`` with the systemd driver,
  ``/kubepods/<qos>/pod<uid>/<id>`` with cgroupfs; dcgm-exporter reads the pod uid the same
  way) and Slurm's job cgroup (``/slurm/uid_U/job_J/...`` in cgroup v1,
  ``.../slurmstepd.scope/job_J/...`` in v2). Inside a container with its own cgroup namespace
  the path is ``/`` and tells nothing.
* ``/proc/PID/mountinfo``: a container's bind mounts name it from the inside too: the kubelet
  mounts ``/var/lib/kubelet/pods/<uid>/containers/<name>/...`` (the termination log), Docker
  ``/var/lib/docker/containers/<id>/...`` (hosts, hostname, resolv.conf).
* ``/proc/PID/environ``: ``SLURM_JOB_ID`` (Slurm sets it in every task of a job).
* Names, where the files are readable: the kubelet's log layout on the node,
  ``/var/log/pods/<namespace>_<pod>_<uid>/`` and
  ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log`` (what log shippers parse);
  inside a pod, the service account's ``namespace`` file and the container's hostname
  (Kubernetes sets it to the pod's name); Docker's ``config.v2.json`` for a container name.

What a process reports is untrusted: every value is checked against the pattern of what it
names (64-hex ids, DNS-1123 names, decimal job ids) and dropped otherwise. A process's owner is
read once (it does not change in practice) and again every ``REFRESH_S``; directory listings
are kept while the directory's mtime stays the same.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gputop.core.model import Owner

REFRESH_S = 30.0
MAX_CACHED = 4096  # processes whose owner is kept (a tick reads only the GPU processes')
ENVIRON_BYTES = 256 * 1024  # bounded read: an environment can be large
LISTING_KEEP_S = 10.0

KUBELET_PODS = "/var/lib/kubelet/pods"
POD_LOGS = "/var/log/pods"
CONTAINER_LOGS = "/var/log/containers"
DOCKER_CONTAINERS = "/var/lib/docker/containers"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

_ID = r"[0-9a-f]{64}"
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# A container's scope or directory, as each runtime names it under systemd or cgroupfs.
_SCOPE = re.compile(rf"^(docker|cri-containerd|crio|libpod)-({_ID})\.scope$")
_BARE_ID = re.compile(rf"^({_ID})$")
_POD = re.compile(rf"pod({_UID})(?:\.slice)?$")
_SLURM_JOB = re.compile(r"^job_([0-9]{1,12})$")
_KUBELET_MOUNT = re.compile(rf"{re.escape(KUBELET_PODS)}/({_UID})/containers/([^/\s]+)/")
_DOCKER_MOUNT = re.compile(rf"{re.escape(DOCKER_CONTAINERS)}/({_ID})/")
# DNS-1123 names (pods, namespaces, containers) are at most 253 characters of [a-z0-9.-].
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_CONTAINER_LOG = re.compile(rf"^(.+)_(.+)_(.+)-({_ID})\.log$")
_POD_LOG = re.compile(rf"^(.+)_(.+)_({_UID})$")
_RUNTIMES = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o",
             "libpod": "podman"}


def _read(path: str, size: int = 65536) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks, left = [], size
            while left > 0:
                chunk = os.read(fd, min(left, 65536))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    except OSError:
        return None


def _name(value: str | None) -> str | None:
    return value if value and _NAME.match(value) else None


def _uid(value: str) -> str:
    return value.replace("_", "-")


# -- what one process shows -------------------------------------------------------------------


def cgroup_paths(pid: int | str) -> list[str]:
    """The cgroup paths of a process, one per hierarchy (v1) or the one of v2."""
    data = _read(f"/proc/{pid}/cgroup")
    if data is None:
        return []
    paths = []
    for line in data.decode(errors="replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2] not in paths:
            paths.append(parts[2])
    return paths


def owner_from_cgroups(paths: list[str]) -> Owner:
    """Runtime, container id, pod uid and Slurm job from cgroup paths (pure)."""
    runtime = container_id = pod_uid = slurm = None
    for path in paths:
        segments = [s for s in path.split("/") if s]
        kube = any(s.startswith("kubepods") for s in segments)
        slurmish = "slurm" in path
        for i, seg in enumerate(segments):
            m = _SCOPE.match(seg)
            if m:
                runtime, container_id = _RUNTIMES[m.group(1)], m.group(2)
                continue
            m = _POD.search(seg) if kube else None
            if m:
                pod_uid = _uid(m.group(1))
                continue
            m = _BARE_ID.match(seg)
            if m and (kube or (i > 0 and segments[i - 1] == "docker")):
                container_id = m.group(1)
                runtime = runtime or ("docker" if not kube else None)
                continue
            m = _SLURM_JOB.match(seg) if slurmish else None
            if m:
                slurm = m.group(1)
        if pod_uid is not None and runtime is None and container_id is not None:
            runtime = "kubernetes"  # cgroupfs driver: the runtime is not in the path
    return Owner(runtime=runtime, container_id=container_id, pod_uid=pod_uid, slurm_job=slurm)


def owner_from_mounts(pid: int | str) -> Owner:
    """Pod uid and container name (kubelet mounts) or a Docker id, seen from the inside."""
    data = _read(f"/proc/{pid}/mountinfo", 1 << 20)
    if data is None:
        return Owner()
    text = data.decode(errors="replace")
    m = _KUBELET_MOUNT.search(text)
    if m:
        return Owner(runtime="kubernetes", pod_uid=_uid(m.group(1)), container=_name(m.group(2)))
    m = _DOCKER_MOUNT.search(text)
    if m:
        return Owner(runtime="docker", container_id=m.group(1))
    return Owner()


def environ(pid: int | str, names: tuple[str, ...]) -> dict[str, str]:
    """Some variables of a process's environment (same user or root), bounded."""
    data = _read(f"/proc/{pid}/environ", ENVIRON_BYTES)
    out: dict[str, str] = {}
    if not data:
        return out
    wanted = {n.encode() + b"=": n for n in names}
    for item in data.split(b"\0"):
        for prefix, name in wanted.items():
            if item.startswith(prefix):
                out[name] = item[len(prefix):len(prefix) + 256].decode(errors="replace")
    return out


# -- names from the node's files --------------------------------------------------------------

_listings: dict[str, tuple[tuple[int, int], float, list[str]]] = {}


def _listing(directory: str) -> list[str]:
    """The directory's entries, listed again only when it changed (or every 10 s)."""
    try:
        st = os.stat(directory)
    except OSError:
        return []
    key = (st.st_ino, st.st_mtime_ns)
    now = time.monotonic()
    cached = _listings.get(directory)
    if cached is not None and cached[0] == key and now - cached[1] < LISTING_KEEP_S:
        return cached[2]
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    _listings[directory] = (key, now, names)
    return names


def kubelet_names(owner: Owner, pod_logs: str = POD_LOGS,
                  container_logs: str = CONTAINER_LOGS) -> Owner:
    """Pod, namespace and container names from the kubelet's log layout on the node."""
    if owner.container_id and not (owner.pod and owner.container):
        for entry in _listing(container_logs):
            m = _CONTAINER_LOG.match(entry)
            if m and m.group(4) == owner.container_id:
                owner = replace(owner, pod=owner.pod or _name(m.group(1)),
                                namespace=owner.namespace or _name(m.group(2)),
                                container=owner.container or _name(m.group(3)))
                break
    if owner.pod_uid and not (owner.pod and owner.namespace):
        for entry in _listing(pod_logs):
            m = _POD_LOG.match(entry)
            if m and _uid(m.group(3)) == owner.pod_uid:
                owner = replace(owner, namespace=owner.namespace or _name(m.group(1)),
                                pod=owner.pod or _name(m.group(2)))
                break
    return owner


def docker_name(container_id: str, root: str = DOCKER_CONTAINERS) -> str | None:
    """A Docker container's name from its config (root can read it), without the slash."""
    data = _read(f"{root}/{container_id}/config.v2.json", 1 << 20)
    if not data:
        return None
    try:
        name = json.loads(data).get("Name")
    except (ValueError, AttributeError):
        return None
    if isinstance(name, str):
        name = name.lstrip("/")
        return name if re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", name) else None
    return None


def inside_pod_names(pid: int | str, owner: Owner) -> Owner:
    """Seen from inside a pod: the namespace from the service account, the pod's name from
    the container's hostname (Kubernetes sets it to the pod name)."""
    root = f"/proc/{pid}/root"
    if owner.namespace is None:
        data = _read(root + SERVICE_ACCOUNT_NAMESPACE, 256)
        if data:
            owner = replace(owner, namespace=_name(data.decode(errors="replace").strip()))
    if owner.pod is None:
        host = environ(pid, ("HOSTNAME",)).get("HOSTNAME")
        owner = replace(owner, pod=_name(host))
    return owner


def read_owner(pid: int | str) -> Owner | None:
    """Everything readable about who owns ``pid``; None when nothing is known."""
    owner = owner_from_cgroups(cgroup_paths(pid))
    if owner.container_id is None and owner.pod_uid is None:
        inside = owner_from_mounts(pid)
        owner = replace(owner, **{k: v for k, v in inside.__dict__.items() if v is not None})
    env = environ(pid, ("SLURM_JOB_ID", "SLURM_JOBID"))
    slurm = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if slurm and slurm.isdigit() and len(slurm) <= 12:
        # The cgroup is Slurm's (the process cannot leave it); the environment is the process's
        # own word. Where they disagree the cgroup wins and the other is only the process's
        # claim, never the GPU's job (a user would bill their GPU to another job).
        if owner.slurm_job is None:
            owner = replace(owner, slurm_job=slurm)
        elif owner.slurm_job != slurm:
            owner = replace(owner, slurm_claim=slurm)
    if owner.pod_uid or owner.container_id:
        owner = kubelet_names(owner)
        if owner.pod_uid and (owner.pod is None or owner.namespace is None) \
                and owner.runtime == "kubernetes" and owner.container_id is None:
            owner = inside_pod_names(pid, owner)  # only the kubelet's mounts: we are inside
    if owner.runtime == "docker" and owner.container_id and owner.container is None:
        owner = replace(owner, container=docker_name(owner.container_id))
    return None if owner.is_empty() else owner


# -- per process, cached ----------------------------------------------------------------------


@dataclass
class _Entry:
    value: Any
    read_at: float


class PerProcess:
    """``get(pid, create_time)``: ``reader(pid)`` once per process, again every REFRESH_S (a
    reused pid has another create time, so it is read afresh)."""

    def __init__(self, reader: Callable[[int], Any]) -> None:
        self.reader = reader
        self._entries: dict[tuple[int, float | None], _Entry] = {}

    def get(self, pid: int, create_time: float | None) -> Any:
        key = (pid, create_time)
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is None or now - entry.read_at > REFRESH_S:
            if len(self._entries) >= MAX_CACHED:
                self._entries.clear()
            entry = self._entries[key] = _Entry(self.reader(pid), now)
        return entry.value
