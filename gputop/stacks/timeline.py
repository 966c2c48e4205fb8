"""Python stacks over time, from outside: py-spy sampling a process and its DataLoader workers
while a capture records, with the time of every sample, so the samples can be placed on the
trace's steps and idle intervals (``trace_join``).

``TimelineRecorder`` runs ``py-spy record --format chrometrace --idle --nonblocking`` on each
process from ``start()`` to ``stop()`` (SIGINT, on which py-spy writes its file), at py-spy's
default rate: the job is never paused and pays nothing but the CPU py-spy itself takes
(benchmarks/bench_capture.py). py-spy's times count from its own start, which ``start()`` notes
on the wall clock (measured: py-spy's zero is 0-2 ms after the launch).

The chrometrace file is a list of B/E events: the frames that begin and end between one
sample of a thread and its next, so a thread that sits still writes nothing and its stack
holds until it changes. py-spy keys its "previous stack" by thread id alone: forked workers
share their parent's thread ids, and with ``--subprocesses`` the events of one id interleave
samples of several processes (each rewriting its whole stack). Replayed in order per thread
id they still give each sample's stack (py-spy's ``process N`` frames say whose), and a sample
ends where a begin is followed by an end, or the time moves on; but one py-spy per process
writes far less, so that is what the recorder runs.

py-spy's output describes another process (names, file paths): it is untrusted, bounded in
size, events, depth and field length, and escaped where printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gputop.stacks.access import StacksError, refusal
from gputop.stacks.profile import MAX_FRAMES, Frame, _clip
from gputop.stacks.pyspy import DEFAULT_RATE, NOT_INSTALLED, find_py_spy

MAX_FILE = 64 << 20  # bytes of one process's chrometrace read; more is not used
MAX_EVENTS = 2_000_000
STOP_GRACE_S = 10.0  # py-spy writes its file on SIGINT; killed if it takes longer
SAMPLING_WAIT_S = 5.0  # how long a capture waits for py-spy to start sampling, at most
_PROCESS = re.compile(r"^process (\d+):")


@dataclass(frozen=True)
class Sample:
    """One stack of one thread, held from ``t`` for ``dur`` seconds (py-spy writes a stack
    once and again only when it changes: a thread that sits still is one long sample)."""

    t: float  # wall clock (time.time()), seconds
    dur: float
    pid: int
    tid: int  # the Python thread ident (threading.get_ident() in that process)
    frames: tuple[Frame, ...]  # outermost first


@dataclass
class Timeline:
    samples: list[Sample]
    rate: int
    start: float  # wall clock of py-spy's time zero
    end: float
    notes: list[str] = field(default_factory=list)

    @property
    def period(self) -> float:
        return 1.0 / self.rate


def parse_chrometrace(text: str, epoch: float, rate: int) -> Timeline:
    """py-spy's chrometrace output (its times from ``epoch`` on the wall clock)."""
    try:
        events = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StacksError(f"py-spy wrote an unreadable timeline ({str(exc)[:100]})") from None
    if not isinstance(events, list):
        raise StacksError("py-spy wrote an unreadable timeline (not a list of events)")
    stacks: dict[int, list[Frame]] = {}
    pids: dict[int, int] = {}
    last: dict[int, tuple[float, str]] = {}  # per thread key: (ts, phase) of its last event
    raw: dict[int, list[tuple[float, int, tuple[Frame, ...]]]] = {}  # key -> (ts, pid, frames)
    bad = 0
    end_ts = 0.0

    def close(key: int) -> None:
        ts, _ = last[key]
        frames = stacks.get(key) or []
        pid = pids.get(key)
        own = [f for f in frames if not f.function.startswith("process ")]
        for f in frames:  # the innermost "process N" frame names the sampled process
            found = _PROCESS.match(f.function)
            if found:
                pid = int(found.group(1))
        if own and pid is not None:
            raw.setdefault(key, []).append((ts, pid, tuple(own[-MAX_FRAMES:])))

    for ev in events[:MAX_EVENTS]:
        if not isinstance(ev, dict) or ev.get("ph") not in ("B", "E"):
            continue
        key, ts, phase = ev.get("tid"), ev.get("ts"), ev["ph"]
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not isinstance(key, int):
            bad += 1
            continue
        end_ts = max(end_ts, float(ts))
        prev = last.get(key)
        if prev is not None and (prev[0] != ts or (prev[1] == "B" and phase == "E")):
            close(key)  # the previous sample of this thread id is complete
        stack = stacks.setdefault(key, [])
        if phase == "B":
            args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            line = args.get("line")
            stack.append(Frame(_clip(str(ev.get("name") or "?")),
                               _clip(str(args.get("filename") or "")),
                               line if isinstance(line, int) and line > 0 else None))
            if isinstance(ev.get("pid"), int):
                pids[key] = ev["pid"]
        elif stack:
            stack.pop()
        last[key] = (float(ts), phase)
    # The events written at the end close every stack at once: not a sample.
    notes = [f"{bad} unreadable py-spy event(s) skipped"] if bad else []
    if len(events) > MAX_EVENTS:
        notes.append(f"py-spy timeline cut at {MAX_EVENTS:,} events")
    samples = [s for key, rows in raw.items() for s in _held(key, rows, last[key][0], rate, epoch)]
    samples.sort(key=lambda s: s.t)
    return Timeline(samples, rate, epoch, epoch + end_ts / 1e6, notes)


def _held(key: int, rows: list[tuple[float, int, tuple[Frame, ...]]], last_ts: float,
          rate: int, epoch: float) -> list[Sample]:
    """Each stack holds until the same process's next stack on this thread id. When several
    processes share the id, a stack that has no successor holds one sampling period."""
    shared = len({pid for _, pid, _ in rows}) > 1
    following: dict[int, float] = {}
    out = []
    for ts, pid, frames in reversed(rows):
        end = following.get(pid)
        if end is None:
            end = ts + 1e6 / rate if shared else max(last_ts, ts + 1e6 / rate)
        following[pid] = ts
        out.append(Sample(epoch + ts / 1e6, (end - ts) / 1e6, pid, key, frames))
    return out


MAX_PROCESSES = 9  # the training process and 8 DataLoader workers


class TimelineRecorder:
    """py-spy sampling ``pid`` and the processes under it (its DataLoader workers), from
    ``start()`` to ``stop()``: one py-spy per process, each writing only what changes (with
    ``--subprocesses`` py-spy would rewrite whole stacks at every sample, its thread-id mix-up
    above). Every failure is a one-line ``error``, never an exception: the capture goes on
    without stacks."""

    def __init__(self, pid: int, rate: int = DEFAULT_RATE, max_seconds: float = 600.0) -> None:
        self.pid, self.rate, self.max_seconds = pid, rate, max_seconds
        self.error: str | None = None
        self.notes: list[str] = []
        self._procs: list[tuple[int, float, subprocess.Popen]] = []  # (pid, epoch, py-spy)
        self._dir: Path | None = None

    def start(self) -> bool:
        binary = find_py_spy()
        if binary is None:
            self.error = NOT_INSTALLED
            return False
        try:
            why = refusal(self.pid)
        except StacksError as exc:
            why = str(exc)
        if why is not None:
            self.error = why
            return False
        targets = [self.pid, *_children(self.pid)]
        if len(targets) > MAX_PROCESSES:
            self.notes.append(f"stacks of {MAX_PROCESSES - 1} of the {len(targets) - 1} "
                              "processes under the training process sampled")
            targets = targets[:MAX_PROCESSES]
        self._dir = Path(tempfile.mkdtemp(prefix="gputop-timeline-"))  # 0700, ours
        for target in targets:
            cmd = [binary, "record", "--pid", str(target), "--rate", str(self.rate),
                   "--format", "chrometrace", "--output", str(self._dir / f"{target}.json"),
                   "--idle", "--nonblocking", "--full-filenames",
                   "--duration", str(max(1, int(self.max_seconds)))]
            try:
                with open(self._dir / f"{target}.log", "wb") as log:
                    epoch = time.time()
                    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT,
                                            env={**os.environ, "RUST_BACKTRACE": "0"})
            except OSError as exc:
                self.error = f"py-spy could not start: {exc.strerror or exc}"
                self.stop()
                return False
            self._procs.append((target, epoch, proc))
        self._wait_sampling()
        return True

    def _wait_sampling(self) -> None:
        """Until every py-spy samples (it says so once attached): its start-up takes a few
        hundred ms of CPU, which should not fall on the steps recorded, nor the steps before
        py-spy sees them (a fast job records 3 steps in well under a second)."""
        assert self._dir is not None
        deadline = time.monotonic() + SAMPLING_WAIT_S
        waiting = {target for target, _, _ in self._procs}
        while waiting and time.monotonic() < deadline:
            for target, _, proc in self._procs:
                if target not in waiting:
                    continue
                try:
                    started = b"Sampling process" in (self._dir / f"{target}.log").read_bytes()
                except OSError:
                    started = False
                if started or proc.poll() is not None:
                    waiting.discard(target)
            time.sleep(0.01)

    @property
    def running(self) -> bool:
        return any(proc.poll() is None for _, _, proc in self._procs)

    def stop(self) -> Timeline | None:
        """Stop sampling and return what was sampled (None, with ``error`` set, when nothing
        of the training process could be read)."""
        procs, self._procs = self._procs, []
        try:
            for _, _, proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)  # py-spy writes its file and exits
            deadline = time.monotonic() + STOP_GRACE_S
            for _, _, proc in procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            timelines = []
            for target, epoch, _ in procs:
                got = self._read(target, epoch)
                if got is not None:
                    timelines.append(got)
                elif target == self.pid:
                    return None
            if not timelines:
                return None
            samples = sorted((s for t in timelines for s in t.samples), key=lambda s: s.t)
            return Timeline(samples, self.rate, min(t.start for t in timelines),
                            max(t.end for t in timelines),
                            [*self.notes, *(n for t in timelines for n in t.notes)])
        finally:
            self._cleanup()

    def _read(self, target: int, epoch: float) -> Timeline | None:
        assert self._dir is not None
        path = self._dir / f"{target}.json"
        try:
            size = path.stat().st_size
        except OSError:
            log = (self._dir / f"{target}.log").read_bytes()[-2000:].decode(errors="replace")
            last = next((line.strip() for line in reversed(log.splitlines())
                         if line.strip() and "Control-C" not in line), "no output")
            if target == self.pid:
                self.error = f"py-spy wrote no stacks: {_clip(' '.join(last.split()))[:200]}"
            return None
        if size > MAX_FILE:
            self.error = f"py-spy's timeline of pid {target} is over {MAX_FILE >> 20} MB"
            return None
        try:
            return parse_chrometrace(path.read_text(errors="replace"), epoch, self.rate)
        except StacksError as exc:
            self.error = str(exc)
            return None

    def _cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _children(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # gone, or not ours to list: the training process alone
        return []
