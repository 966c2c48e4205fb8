"""What the agent knows about its own pids when it runs in a container's pid namespace.

NVML names processes by their host pid; a process in a container knows only its own. The agent
learns its host pid where the kernel shows it (its ``NSpid`` when its ``/proc`` is the host's,
``/proc/self/sched`` on kernels before 4.14), or where a gputop on the host tells it (the
``seen`` request: a monitor in the host's namespace reads the agent's host pid from
``SO_PEERCRED``). A gputop inside a container then maps NVML's pid to this process through the
agent's ``status``. In the host's own namespace there is nothing to say.
"""

from __future__ import annotations

import os
from typing import Any

from gputop.core.pidns import INIT_PIDNS, nspids, sched_pid
from gputop.core.protocol import pid_namespace


def _procfs_is_hosts() -> bool:
    try:
        return os.readlink("/proc/1/ns/pid") == f"pid:[{INIT_PIDNS}]"
    except OSError:
        return False


def own_host_pid() -> tuple[int | None, str | None]:
    """(host pid, how it was read) from what the kernel shows this process, or (None, None)."""
    me = os.getpid()
    found = nspids("self")
    if found and len(found) > 1 and found[-1] == me and _procfs_is_hosts():
        return found[0], "nspid"
    seen = sched_pid("self")
    if seen is not None and seen != me:
        return seen, "sched"
    return None, None


class PidInfo:
    """The agent's pid namespace and host pid, for its ``status`` reply."""

    def __init__(self) -> None:
        self._for_pid = 0
        self._pidns: int | None = None
        self._host: tuple[int | None, str | None] = (None, None)

    def _refresh(self) -> None:
        pid = os.getpid()
        if pid != self._for_pid:  # first use, or a forked child (its own pids)
            self._for_pid = pid
            self._pidns = pid_namespace()
            self._host = own_host_pid() if self.namespaced else (None, None)

    @property
    def namespaced(self) -> bool:
        return self._pidns is not None and self._pidns != INIT_PIDNS

    def status(self) -> dict[str, Any]:
        """``pidns``, ``host_pid`` and its source, in a namespace other than the host's."""
        self._refresh()
        if not self.namespaced:
            return {}
        host, source = self._host
        return {"pidns": self._pidns, "host_pid": host, "host_pid_source": source}

    def seen(self, message: dict[str, Any]) -> dict[str, Any]:
        """A gputop in the host's pid namespace says which pid it sees this process as."""
        self._refresh()
        host = message.get("host_pid")
        if set(message) - {"cmd", "host_pid"} or not isinstance(host, int) \
                or isinstance(host, bool) or not 0 < host < 1 << 31:
            return {"ok": False, "error": "bad-request",
                    "message": 'seen takes "host_pid": a positive pid'}
        if not self.namespaced:
            return {"ok": True, "host_pid": os.getpid()}  # the host's pid is our own
        if self._host[1] in (None, "monitor"):
            self._host = (host, "monitor")
        return {"ok": True, "host_pid": self._host[0]}
