"""Agents across pid (and mount) namespaces, from the monitor's side.

Three cases besides the plain one (agent and monitor in one namespace, socket in our own
directory, named after the pid both see):

* **The monitor on the host, the job in a container.** The job is visible with its host pid
  ``H``; its agent named its socket after its pid inside (``<p>-ns<inode>.sock``, or
  ``<p>.sock`` from an older agent) in the container's own ``/tmp``, which the host reaches
  through ``/proc/H/root`` (the same access as reading the process's memory: its own user,
  or root). ``SO_PEERCRED`` shows the host this agent as ``H``, so the usual check holds: the
  socket is served by the process we asked for. Its traces are under ``/proc/H/root`` too.
  The monitor tells such an agent its host pid (``seen``), so a gputop in the container can
  later map NVML's pids to it.
* **The monitor in the job's container** (``kubectl exec``, ``docker exec``): the agent is in
  our namespace and our ``/tmp``; its socket carries our namespace's inode.
* **The monitor in a sibling namespace sharing ``/tmp``** (``unshare``, a sidecar with a shared
  volume): the agent's process is invisible (``SO_PEERCRED`` gives pid 0), but its socket is in
  our private, own-user directory, so its peer runs as us (or root). It can be asked for its
  status; when it knows its host pid, NVML's row for that pid is named from it and ``p``
  captures through it (``lookup``).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputop.client.agents import (
    AgentConnection,
    Located,
    _owner,
    add_locator,
    agent_status,
    request,
)
from gputop.core.agent_status import AgentStatus, parse_status
from gputop.core.pidns import INIT_PIDNS, in_init_pidns, ns_inode, nspids
from gputop.core.protocol import (
    _NS_SOCKET_NAME,
    _SOCKET_NAME,
    AgentError,
    _base_dirs,
    check_socket_dir,
    pid_namespace,
    socket_name,
)

MAX_FOREIGN = 64  # agents of other namespaces asked per discovery
FOREIGN_TIMEOUT_S = 0.5
ABSENT_KEEP_S = 10.0  # a container's GPU process without an agent is looked for again after


@dataclass(frozen=True)
class ForeignAgent:
    """An agent of a namespace this gputop cannot see into, reached through a shared /tmp."""

    path: Path
    owner: int
    inner_pid: int  # its pid in its own namespace (the socket's name)
    pidns: int | None  # its namespace (None: the host's)
    status: AgentStatus

    @property
    def host_pid(self) -> int | None:
        if self.pidns is None:
            return self.inner_pid  # an agent in the host's namespace is named by its host pid
        value = self.status.host_pid
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
            else None


_lock = threading.Lock()
_foreign: dict[int, ForeignAgent] = {}  # by host pid, from the last discovery
_told: set[tuple[int, int]] = set()  # (host pid, pid namespace) told their host pid
_argv: dict[tuple[str, int, int | None], list[str]] = {}  # a foreign agent's command line
_absent: dict[int, float] = {}  # host pid -> when no agent was found for it
# GPU pids that run in this pid namespace (one NSpid): a process never changes its pid
# namespace, so those are not read again while they stay on a GPU (one /proc read per GPU
# process a tick otherwise); a pid that leaves the GPUs is forgotten, a reused one read afresh.
_flat: set[int] = set()


def _clean_argv(argv: Any) -> list[str]:
    """An agent's argv, bounded (it is untrusted): 64 strings of 512 characters at most."""
    if not isinstance(argv, list):
        return []
    return [a[:512] for a in argv[:64] if isinstance(a, str)]


def _other_mount_ns(pid: int) -> bool:
    theirs, ours = ns_inode(pid, "mnt"), ns_inode("self", "mnt")
    return theirs is not None and ours is not None and theirs != ours


def _socket_in(directory: Path, names: list[str], owner: int) -> Path | None:
    try:
        check_socket_dir(directory, owner)
    except (OSError, AgentError):
        return None
    for name in names:
        path = directory / name
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def locate(pid: int) -> Located | None:
    """The agent of ``pid`` when it is not where the plain search looks: in our namespace
    under its namespaced name, in a container (``pid`` visible, its namespace nested in
    ours), or, for a host pid this namespace cannot see, an agent discovered in a shared
    directory that reported that host pid."""
    own = pid_namespace()
    uid = os.geteuid()
    if own is not None and own != INIT_PIDNS:
        name = socket_name(pid, own)
        for directory in _base_dirs(uid):
            path = _socket_in(directory, [name], uid)
            if path is not None:
                return Located(path, uid, (pid,))
    inner = nspids(pid)
    if inner and len(inner) > 1:
        found = _in_container(pid, inner[-1])
        if found is not None:
            return found
    if not in_init_pidns() and not os.path.exists(f"/proc/{pid}"):
        agent = lookup(pid)
        if agent is not None:
            return Located(agent.path, agent.owner, (0,))
    return None


def _in_container(pid: int, inner: int) -> Located | None:
    """The socket of a visible process ``pid`` whose pid in its own namespace is ``inner``."""
    owner = _owner(pid)
    if owner is None:
        return None
    root = f"/proc/{pid}/root" if _other_mount_ns(pid) else ""
    names = [socket_name(inner, ns_inode(pid)), f"{inner}.sock"]
    for directory in _base_dirs(owner):
        found = _socket_in(Path(root + str(directory)), names, owner)
        if found is not None:
            return Located(found, owner, (pid,), root)
    return None


def _foreign_sockets() -> list[tuple[Path, int, int | None, int]]:
    """(path, pid in its namespace, its namespace or None for the host's, owner uid) of the
    sockets in our directories that belong to namespaces other than ours."""
    own = pid_namespace()
    uid = os.geteuid()
    found = []
    for directory in _base_dirs(uid):
        try:
            check_socket_dir(directory, uid)
            entries = list(os.scandir(directory))
        except (OSError, AgentError):
            continue
        for entry in entries:
            m = _NS_SOCKET_NAME.match(entry.name)
            plain = _SOCKET_NAME.match(entry.name) if m is None else None
            if m is not None and int(m.group(2)) != own:
                found.append((Path(entry.path), int(m.group(1)), int(m.group(2)), uid))
            elif plain is not None and not in_init_pidns():
                found.append((Path(entry.path), int(plain.group(1)), None, uid))
        if len(found) >= MAX_FOREIGN:
            break
    return found[:MAX_FOREIGN]


def discover() -> list[ForeignAgent]:
    """Ask every agent of another namespace in our directories for its status (each bounded
    by FOREIGN_TIMEOUT_S); keep those that answer, by host pid, for ``lookup``. The status
    carries the command line (``argv``, from the agent's ``hello``, asked once): this
    namespace cannot read the process's own."""
    agents = []
    for path, inner, pidns, owner in _foreign_sockets():
        try:
            with AgentConnection(inner, FOREIGN_TIMEOUT_S, path=path, peers=(0,)) as conn:
                status = conn.call({"cmd": "status"})
                argv = _argv.get((str(path), inner, pidns))
                if argv is None:
                    argv = _argv[(str(path), inner, pidns)] = _clean_argv(
                        conn.call({"cmd": "hello"}).get("argv"))
        except (AgentError, OSError, ValueError):
            continue
        checked = parse_status({**status, "argv": argv})  # the one check of what an agent says
        agents.append(ForeignAgent(path, owner, inner, pidns, checked))
    with _lock:
        _foreign.clear()
        for agent in agents:
            if agent.host_pid is not None:
                _foreign[agent.host_pid] = agent
    return agents


def lookup(host_pid: int) -> ForeignAgent | None:
    """The agent of another namespace that reported ``host_pid`` (discovering once more when
    the last discovery did not have it)."""
    with _lock:
        agent = _foreign.get(host_pid)
    if agent is not None:
        return agent
    for agent in discover():
        if agent.host_pid == host_pid:
            return agent
    return None


def tell_host_pid(pid: int, status: dict[str, Any]) -> None:
    """From the host's namespace: tell an agent in a container which host pid it has, once
    (``seen``), so a gputop inside its container can map NVML's pid to it."""
    pidns = status.get("pidns")
    if not in_init_pidns() or not isinstance(pidns, int) or status.get("host_pid") == pid:
        return
    with _lock:
        if (pid, pidns) in _told:
            return
        _told.add((pid, pidns))
    try:
        reply = request(pid, {"cmd": "seen", "host_pid": pid}, timeout=0.5)
    except (AgentError, OSError, ValueError):
        return
    if isinstance(reply.get("host_pid"), int):
        status["host_pid"] = reply["host_pid"]


def probe(gpu_pids: set[int], known: dict[int, AgentStatus]) -> dict[int, AgentStatus]:
    """The agents the plain search does not find, for the sampler: on the host, those of GPU
    processes in containers (by host pid; each told its host pid once); in a container, the
    agents of other namespaces that know their host pid (by that host pid, their own
    ``pid`` being another namespace's)."""
    out: dict[int, AgentStatus] = {}
    if in_init_pidns():
        now = time.monotonic()
        _flat.intersection_update(gpu_pids)
        for pid in sorted(gpu_pids - set(known) - _flat):
            if now - _absent.get(pid, -ABSENT_KEEP_S) < ABSENT_KEEP_S:
                continue  # no agent there a moment ago: not looked for every tick
            inner = nspids(pid)
            if not inner:
                continue
            if len(inner) < 2:
                _flat.add(pid)
                continue
            status = agent_status(pid)
            if status is None:
                _absent[pid] = now
                continue
            _absent.pop(pid, None)
            tell_host_pid(pid, status)
            out[pid] = parse_status(status)  # checked as a plain agent's reply is
        for pid in [p for p, at in _absent.items() if now - at >= ABSENT_KEEP_S]:
            del _absent[pid]
        return out
    for agent in discover():
        host = agent.host_pid
        if host is not None and host in gpu_pids and host not in known:
            out[host] = agent.status  # its own "pid" is another namespace's
    return out


def wire() -> None:
    """Let the client's search for an agent fall back on containers (idempotent). Called by
    what talks to agents (the sampler's session, the capture service), so that finding an agent
    in a container never depends on which module happened to be imported first; the client
    never imports this module (it uses the client)."""
    add_locator(locate)
