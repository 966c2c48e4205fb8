"""Pid namespaces: NVML reports host pids, and a container sees its own.

The NVIDIA driver records the pid of a process in the host's (initial) pid namespace, whatever
namespace the process or the monitor runs in (NVIDIA: "the driver does not support pid
namespaces"). So:

* **On the host**, every GPU process is visible; one in a container has a second pid there,
  the last entry of ``NSpid`` in ``/proc/PID/status`` (Linux 4.1+), shown beside the host pid.
* **In a container with its own pid namespace**, NVML's pids are not this namespace's: reading
  ``/proc/<NVML pid>`` would show another process or none. gputop never does; it maps each
  host pid to a process it can see by, in this order:

  1. the agent of a process here that knows its host pid (``host_pid`` in its status): from
     its own ``NSpid`` when its ``/proc`` is the host's, from ``/proc/self/sched`` on kernels
     that print the host pid there (before 4.14), or told by a gputop on the host that
     reached it (a monitor in the initial namespace sees the agent's host pid in
     ``SO_PEERCRED`` and says so, with the ``seen`` request);
  2. elimination per GPU: the processes here that hold the GPU's device file
     ``/dev/nvidia<minor>`` open; when one host pid and one such process are left on a GPU,
     they are the same (the usual pod: one process per GPU);
  3. an agent in a namespace gputop cannot see (a sibling container sharing ``/tmp``): its
     socket is reachable and it reports its host pid (1.); the row is named from it.

  Otherwise the row says in one line why it cannot be named.

Pure helpers here; the mapping is ``collect.sampler``'s, the agents' side
``gputop.client.namespaces``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping

INIT_PIDNS = 0xEFFFFFFC  # PROC_PID_INIT_INO: the inode of the initial pid namespace
MAX_FD_SCAN_PROCESSES = 4096  # elimination reads at most this many processes' fd tables
DEVICE_PREFIX = "/dev/nvidia"


def ns_inode(pid: int | str = "self", kind: str = "pid") -> int | None:
    """The inode of a process's namespace of ``kind`` (None when not readable)."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def own_pidns() -> int | None:
    return ns_inode("self")


def in_init_pidns() -> bool:
    """True when this process runs in the host's pid namespace (or it cannot tell)."""
    ino = own_pidns()
    return ino is None or ino == INIT_PIDNS


def nspids(pid: int | str) -> tuple[int, ...] | None:
    """``NSpid`` of ``/proc/PID/status``: the pid in this procfs's namespace first, then in
    each nested namespace down to the process's own."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            data = f.read(8192)
    except OSError:
        return None
    for line in data.split(b"\n"):
        if line.startswith(b"NSpid:"):
            try:
                return tuple(int(x) for x in line.split()[1:])
            except ValueError:
                return None
    return None


def ns_pid(pid: int) -> int | None:
    """The pid of a visible process inside its own namespace, when it runs in a nested one."""
    found = nspids(pid)
    return found[-1] if found and len(found) > 1 else None


def sched_pid(pid: int | str = "self") -> int | None:
    """The pid in the first line of ``/proc/PID/sched`` ("comm (PID, #threads: N)"): kernels
    before 4.14 print the host's pid there, later ones this namespace's."""
    try:
        with open(f"/proc/{pid}/sched", "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    head, sep, _ = first.rpartition(b", #threads")
    if not sep:
        return None
    try:
        return int(head.rpartition(b"(")[2])
    except ValueError:
        return None


def device_holders(minors: Iterable[int], prefix: str = DEVICE_PREFIX,
                   pids: Iterable[int] | None = None) -> dict[int, set[int]]:
    """{minor: pids of the processes here that hold ``<prefix><minor>`` open}, from their fd
    tables (readable for one's own processes, or as root); at most MAX_FD_SCAN_PROCESSES."""
    wanted = {f"{prefix}{m}": m for m in minors}
    out: dict[int, set[int]] = {m: set() for m in wanted.values()}
    if not wanted:
        return out
    if pids is None:
        try:
            pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        except OSError:
            return out
    me = os.getpid()
    for n, pid in enumerate(pids):
        if n >= MAX_FD_SCAN_PROCESSES:
            break
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            minor = wanted.get(target)
            if minor is not None:
                out[minor].add(pid)
    return out


def eliminate(host_pids: Mapping[int, Iterable[int]], holders: Mapping[int, set[int]],
              known: Mapping[int, int]) -> dict[int, int]:
    """{host pid: local pid} by elimination (pure).

    ``host_pids``: per GPU, the host pids NVML reports; ``holders``: per GPU, the local
    processes holding its device file; ``known``: pairs already matched. Whenever a GPU has
    exactly one unmatched host pid and one unmatched holder, they are the same process;
    matching repeats until nothing changes (a process matched on one GPU is no longer a
    candidate on the others, which resolves a rank that also holds GPU 0)."""
    matched = dict(known)
    changed = True
    while changed:
        changed = False
        used = set(matched.values())
        for gpu, pids in host_pids.items():
            left = [h for h in dict.fromkeys(pids) if h not in matched]
            free = [p for p in holders.get(gpu, ()) if p not in used]
            if len(left) == 1 and len(free) == 1:
                matched[left[0]] = free[0]
                used.add(free[0])
                changed = True
    return {h: p for h, p in matched.items() if h not in known}


def hidden_reason(host_pid: int) -> str:
    """One line: why NVML's pid cannot be named here."""
    return (f"host pid {host_pid} runs outside this pid namespace: run gputop on the host or "
            "in the job's container, start the job with `gputop run`, or give this container "
            "the host's pid namespace (docker --pid=host, hostPID: true)")


def pid_alive(pid: int, *, zombie_alive: bool = True) -> bool:
    """Whether process ``pid`` exists (another user's too: signal 0 is refused, not failed).
    With ``zombie_alive=False`` a zombie (it exited, its parent has not reaped it) is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if zombie_alive:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return b") Z" not in f.read(512)
    except OSError:
        return False
