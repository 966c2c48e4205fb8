"""`gputop top --replay DIR`: a recording played back on the monitor's own screen.

The recorded snapshots go through the History (charts) and the live rules (findings) exactly as
live samples do, at the pace they were recorded, on a thread of their own. The keys move a
target index (pause, step one sample, seek a minute, jump to either end); the thread moves the
History there. Going forward records the samples in between and runs the rules on them; going
back rebuilds the History from at most the hour before the target (the longest chart window
but "whole run"), and takes the findings the rules had there (they are kept per sample, so the
rules never run twice on one).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

from gputop.core.model import Snapshot
from gputop.diagnostics.findings import Finding
from gputop.tui.view.frames import Feed, Frame, build_frame

REBUILD_S = 3600.0  # going back rebuilds the charts from this far before the target
MAX_WAIT_S = 5.0  # a gap in the recording is played as at most this long


class ReplayFeed(Feed):
    """Plays ``snapshots``; ``run`` on a thread of its own, the key actions from the UI."""

    def __init__(self, post: Callable[[Frame], None], snapshots: Sequence[Snapshot],
                 own_pid: int | None = None) -> None:
        super().__init__(post, diagnose=False)
        if not snapshots:
            raise ValueError("a replay needs at least one snapshot")
        self.snapshots = snapshots
        self.times = [s.time for s in snapshots]
        self.own_pid = own_pid
        self.index = -1  # the sample on screen (recorded into the History up to it)
        self._target = 0
        self._found: list[tuple[Finding, ...]] = []  # findings active at each sample so far
        self._diagnosis = None  # LiveDiagnosis, made on the thread
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()

    # -- the UI's side --------------------------------------------------------------------

    @property
    def position(self) -> str:
        """"12/300": the sample on screen, 1-based, of how many; "300/300 END" at the last
        sample (the recording's end: nothing comes after it)."""
        shown = max(self.index, 0) + 1
        end = " END" if shown == len(self.snapshots) else ""
        return f"{shown}/{len(self.snapshots)}{end}"

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._wake.set()

    def step(self, samples: int) -> None:
        """One sample back or forward (and pause: a step is a look at one sample)."""
        with self._lock:
            self.paused = True
            self._target = self._clamp(max(self.index, 0) + samples)
        self._wake.set()

    def seek(self, seconds: float) -> None:
        """By ``seconds`` of the recording's time, back or forward."""
        with self._lock:
            now = self.times[max(self.index, 0)]
            if seconds >= 0:
                target = bisect.bisect_left(self.times, now + seconds)
            else:
                target = bisect.bisect_right(self.times, now + seconds) - 1
            self._target = self._clamp(target)
        self._wake.set()

    def seek_to(self, index: int) -> None:
        """To sample ``index`` (negative: from the end)."""
        with self._lock:
            self._target = self._clamp(index if index >= 0 else len(self.snapshots) + index)
        self._wake.set()

    def request_frame(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _clamp(self, index: int) -> int:
        return max(0, min(len(self.snapshots) - 1, index))

    # -- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        """Play until ``stop``: one frame per sample reached, and one per request."""
        while not self._stop.is_set():
            with self._lock:
                target = self._target
            if target != self.index:
                self._move_to(target)
                self._emit()
                continue
            wait = None
            if not self.paused and self.index < len(self.snapshots) - 1:
                gap = self.times[self.index + 1] - self.times[self.index]
                wait = min(MAX_WAIT_S, max(0.0, gap))
            if self._wake.wait(wait):
                self._wake.clear()
                if self.index == self._target:
                    self._emit()  # a pause, window or focus change: the same sample again
                continue
            with self._lock:
                if self._target == self.index:  # no key moved it meanwhile
                    self._target = self.index + 1

    def _diagnose_to(self, index: int) -> None:
        """Run the live rules over every sample up to ``index`` not yet seen by them."""
        if self._diagnosis is None:
            from gputop.diagnostics.live.mig import LiveDiagnosis  # MIG devices one by one

            self._diagnosis = LiveDiagnosis(own_pid=self.own_pid)
        while len(self._found) <= index and not self._stop.is_set():
            self._diagnosis.update(self.snapshots[len(self._found)])
            self._found.append(tuple(self._diagnosis.findings()))

    def _move_to(self, target: int) -> None:
        self._diagnose_to(target)
        if target < self.index:
            from gputop.core.history import History

            start = bisect.bisect_left(self.times, self.times[target] - REBUILD_S)
            self._history = History()
            for snap in self.snapshots[start:target + 1]:
                self._history.record(snap)
        else:
            for snap in self.snapshots[self.index + 1:target + 1]:
                self.history.record(snap)
        self.index = target
        self.findings = self._found[target] if target < len(self._found) else ()

    def _emit(self) -> None:
        if self.index < 0:
            return
        self.latest_seq += 1
        self.post(build_frame(self.history, self.snapshots[self.index], self.window,
                              self.latest_seq, self.focus_pid, self.findings))
