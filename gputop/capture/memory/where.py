"""The memory findings' "where" line, from the memory captures of this session: after `m` on a
process, ``memory-growth`` and ``memory-pressure`` on its GPU name the line whose allocations
grow (or, when nothing grows, what makes its step's peak).

Fed on the sampling thread after the live rules, like the py-spy "where" lines
(``stacks.where``); the TUI notes each capture's report from its worker thread. Never Textual.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable

from gputop.capture.memory.render import growth_line, peak_line
from gputop.capture.memory.report import MemoryReport
from gputop.core.model import Snapshot
from gputop.diagnostics.findings import Finding

MEMORY_IDS = frozenset({"memory-growth", "memory-pressure"})


class MemoryWhere:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[int, str] = {}  # pid -> its line

    def note(self, report: MemoryReport) -> None:
        """A memory capture of ``report.pid`` finished (any thread)."""
        line = growth_line(report) or peak_line(report)
        if line is None:
            return
        with self._lock:
            self._lines[report.pid] = line

    def enrich(self, findings: Iterable[Finding], snap: Snapshot) -> tuple[Finding, ...]:
        findings = tuple(findings)
        with self._lock:
            lines = dict(self._lines)
        if not lines:
            return findings
        on_gpu = {g.index: [p.pid for p in g.processes] for g in snap.gpus}
        out = []
        for f in findings:
            line = None
            if f.id in MEMORY_IDS:
                pids = [f.pid] if f.pid is not None else on_gpu.get(f.gpu, [])
                line = next((lines[p] for p in pids if p in lines), None)
            out.append(dataclasses.replace(f, where=line) if line is not None else f)
        return tuple(out)
