"""NVML's pids (the host's) to the processes this gputop can see: see ``collect.pidns``.

On the host (or wherever NVML's pids are this namespace's) there is nothing to map. In a
container, each host pid is resolved to a local pid (then sampled as any process, with
``host_pid`` set), to an agent of another namespace that reported that host pid (named from
the agent, not measured), or to a one-line reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gputop.core.agent_status import AgentStatus
from gputop.core.pidns import device_holders, eliminate, hidden_reason

HOLDERS_EVERY_S = 10.0  # the fd-table scan for device holders, at most this often


@dataclass(frozen=True)
class Resolved:
    """One host pid: ``local`` (a pid here), or ``agent`` (the status of an agent in another
    namespace that reported it), or ``hidden`` (why neither)."""

    local: int | None = None
    agent: AgentStatus | None = None
    hidden: str | None = None


class PidResolver:
    """Keeps the matches made (while both pids live) and the last scan of device holders."""

    def __init__(self, holders: Callable[[Iterable[int]], dict[int, set[int]]] = device_holders,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._holders_fn = holders
        self._clock = clock
        self._matched: dict[int, int] = {}  # host pid -> local pid, by elimination
        self._holders: dict[int, set[int]] = {}
        self._holders_at = -1e18

    def resolve(self, per_gpu: Mapping[int, list[int]], minors: Mapping[int, int],
                agents: Mapping[int, AgentStatus],
                alive: Callable[[int], bool]) -> dict[int, Resolved]:
        """``per_gpu``: GPU index -> host pids on it; ``minors``: GPU index -> its device
        minor number; ``agents``: statuses by pid (local agents by their pid here; agents of
        other namespaces by the host pid they reported, their own ``pid`` differing);
        ``alive``: whether a local pid still exists."""
        host_pids = list(dict.fromkeys(h for pids in per_gpu.values() for h in pids))
        out: dict[int, Resolved] = {}
        known: dict[int, int] = {}
        for key, status in agents.items():
            if status.pid == key:  # a local agent: its host pid, if it knows it
                host = status.host_pid  # checked where it was read (core/agent_status.py)
                if host is not None:
                    known[host] = key
            elif key in host_pids:  # another namespace's agent, keyed by its host pid
                out[key] = Resolved(agent=status)
        self._matched = {h: p for h, p in self._matched.items()
                         if h in host_pids and alive(p)}
        known.update({h: p for h, p in self._matched.items() if h not in known})
        left = [h for h in host_pids if h not in known and h not in out]
        if left and minors:
            now = self._clock()
            if now - self._holders_at >= HOLDERS_EVERY_S:
                self._holders = self._holders_fn(minors.values())
                self._holders_at = now
            by_gpu = {gpu: self._holders.get(minor, set()) for gpu, minor in minors.items()}
            new = eliminate({g: [h for h in pids if h not in out] for g, pids in per_gpu.items()},
                            by_gpu, known)
            self._matched.update(new)
            known.update(new)
        for host in host_pids:
            if host in known:
                out[host] = Resolved(local=known[host])
            elif host not in out:
                out[host] = Resolved(hidden=hidden_reason(host))
        return out
