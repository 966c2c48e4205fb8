"""The "where" line of live findings: which Python function a stalled process is busy in
(``decode_sample (dataset.py:48), 61 % of worker samples``), or where a hung one waits.

``WhereFinder`` is fed the active findings on every tick (on the sampling thread, by the TUI's
feed and by `gputop watch`) and returns them with ``where`` filled in once known. Sampling
takes seconds, so it runs on a thread of its own, one process at a time: a finding asks for
one capture while it is active, and a process is sampled at most once per ``min_interval``
(a second finding on it within that time reuses the same stacks). Nothing here blocks the
caller.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable

from gputop.diagnostics.findings import WHERE_IDS, Finding
from gputop.stacks.access import StacksError
from gputop.stacks.profile import StackReport, where_line

MIN_INTERVAL_S = 60.0
SAMPLE_SECONDS = 2

Sampler = Callable[..., StackReport]


def _key(f: Finding) -> tuple:
    return (f.id, f.gpu, f.pid)


class WhereFinder:
    def __init__(self, ids: Collection[str] = WHERE_IDS, *,
                 ids_without_agent: Collection[str] = (), seconds: int = SAMPLE_SECONDS,
                 min_interval: float = MIN_INTERVAL_S, sampler: Sampler | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``ids``: findings that get a where line; ``ids_without_agent``: more findings
        that get one when their process has no agent (`--auto-capture`: stacks stand in for
        a capture)."""
        if sampler is None:
            from gputop.stacks.pyspy import sample_stacks

            sampler = sample_stacks
        self.ids = frozenset(ids)
        self.ids_without_agent = frozenset(ids_without_agent)
        self.seconds = seconds
        self.min_interval = min_interval
        self.sampler = sampler
        self.clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._queue: deque[Finding] = deque()
        self._asked: set[tuple] = set()  # findings handled while they stay active
        self._where: dict[tuple, str] = {}  # finding -> its line, once known
        self._reported: set[tuple] = set()  # lines already returned by ``update``
        # pid -> (when sampled, report or None, the error line or None)
        self._stacks: dict[int, tuple[float, StackReport | None, str | None]] = {}

    # -- the caller's side (any one thread) ---------------------------------------------------

    def wants(self, f: Finding, without_agent: Collection[int]) -> bool:
        if f.pid is None:
            return False
        return f.id in self.ids or (f.id in self.ids_without_agent and f.pid in without_agent)

    def update(self, findings: Iterable[Finding], without_agent: Collection[int] = ()
               ) -> list[Finding]:
        """Take this tick's active findings: new ones that want a where line are queued.
        Returns the findings whose line became known since the last call, with it set."""
        findings = list(findings)
        active = {_key(f) for f in findings}
        ready = []
        with self._lock:
            # A finding that cleared is forgotten: if it raises again it asks again.
            self._asked &= active
            self._where = {k: v for k, v in self._where.items() if k in active}
            self._reported &= active
            for f in findings:
                key = _key(f)
                if key in self._asked or not self.wants(f, without_agent):
                    continue
                self._asked.add(key)
                self._queue.append(f)
                self._wake.notify()
            for f in findings:
                key = _key(f)
                if key in self._where and key not in self._reported:
                    self._reported.add(key)
                    ready.append(dataclasses.replace(f, where=self._where[key]))
            if self._queue and self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._work, name="gputop-where",
                                                daemon=True)
                self._thread.start()
        return ready

    def enrich(self, findings: Iterable[Finding]) -> tuple[Finding, ...]:
        """``findings`` with ``where`` set on those whose line is known."""
        with self._lock:
            known = dict(self._where)
        return tuple(dataclasses.replace(f, where=known[_key(f)]) if _key(f) in known else f
                     for f in findings)

    def close(self) -> None:
        """Stop: a sampling in progress is abandoned (py-spy killed)."""
        with self._lock:
            self._stopped = True
            self._queue.clear()
            self._wake.notify_all()

    # -- the worker thread ----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                finding = self._queue.popleft()
                if _key(finding) not in self._asked:
                    continue  # it cleared while waiting its turn
                recent = self._stacks.get(finding.pid)
                fresh = recent is not None and self.clock() - recent[0] < self.min_interval
            if not fresh:
                recent = self._sample(finding.pid)
            _, report, error = recent
            line = where_line(report, finding.id) if report is not None else None
            with self._lock:
                if self._stopped:
                    return
                now = self.clock()
                self._stacks = {pid: kept for pid, kept in self._stacks.items()
                                if now - kept[0] < self.min_interval}
                self._stacks[finding.pid] = recent
                if _key(finding) in self._asked:
                    self._where[_key(finding)] = line or f"not known: {error or 'no samples'}"

    def _sample(self, pid: int) -> tuple[float, StackReport | None, str | None]:
        started = self.clock()
        try:
            report = self.sampler(pid, self.seconds, should_stop=lambda: self._stopped)
            return started, report, None
        except StacksError as exc:
            return started, None, str(exc)
        except Exception as exc:  # never let the thread die: the finding says what happened
            return started, None, f"{type(exc).__name__}: {exc}"
