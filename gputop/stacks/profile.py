"""What py-spy wrote, parsed into a ``StackReport``: per process (the training process and its
DataLoader workers), how many samples were active and idle, the top functions and lines of the
active ones, where the idle ones wait, and every thread's current stack.

Pure: text in, dataclasses out. py-spy's output describes another user's process (names, file
paths, command lines): it is untrusted, so every line and field is bounded, anything that does
not parse is counted and skipped, and text is escaped where it is printed (``render``).

The raw format (``py-spy record --format raw --subprocesses --threads``) is one line per
distinct stack, outermost frame first, then a space and the number of samples::

    process 41:"python train.py";process 57:"python train.py";thread (57): MainThread;<module> (/w/train.py:80);burn (/w/train.py:21) 76

``dump --json`` is a list of threads, each with its frames innermost first.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MAX_LINE = 65536  # characters of one raw line; longer ones are skipped
MAX_FRAMES = 256  # frames kept of one stack (the innermost ones)
MAX_FIELD = 512  # characters of a name, path or command line
MAX_THREADS = 256  # threads kept per dump
MAX_SEEN = 65536  # distinct frames and stacks shared between the lines of one file
TOP = 10  # entries of each top list
# A stack counts as waiting when at least this share of its samples (and this many) were idle.
IDLE_MIN_SHARE = 0.25
IDLE_MIN_SAMPLES = 2
IDLE_MIN_PROCESS_SHARE = 0.05  # under this idle share a process is busy: no "waiting in"

# A command line may hold newlines (`python -c "..."`): py-spy writes them as they are.
_PROCESS = re.compile(r'process (\d+):"(.*?)";(?=process \d+:"|thread \(|[^;]* \()', re.DOTALL)
_RECORD_END = re.compile(r" \d+\r?$")
MAX_RECORD_LINES = 64
_THREAD = re.compile(r"thread \((0x[0-9a-fA-F]+|\d+)\)(?:: ([^;]*))?(?:;|$)")
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")
_FRAME_SPLIT = re.compile(r"(?<=\));")
# Paths of installed code: the "in your code" frame is the innermost one outside these.
_LIBRARY = re.compile(r"(^|/)(site-packages|dist-packages|lib/python\d[\d.]*|lib64/python\d[\d.]*)"
                      r"/|^<frozen |^<built-in>$")


def _clip(text: str) -> str:
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 1] + "…"


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # as py-spy gives it (full paths with --full-filenames)
    line: int | None = None

    @property
    def is_library(self) -> bool:
        return bool(_LIBRARY.search(self.file))

    @property
    def short_file(self) -> str:
        """The file as a reader knows it: the path inside site-packages
        (``torch/utils/data/dataloader.py``), else the last component."""
        path = self.file
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                return path.rsplit(marker, 1)[1]
        found = re.search(r"/lib(?:64)?/python\d[\d.]*/(.*)$", path)
        if found:
            return found.group(1)
        return os.path.basename(path) or path

    def location(self) -> str:
        return f"{self.short_file}:{self.line}" if self.line is not None else self.short_file

    def to_json(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class RawStack:
    pid: int | None  # the sampled process (innermost "process" prefix), None without -s
    tid: str | None
    thread: str | None
    frames: tuple[Frame, ...]  # outermost first, as py-spy writes them
    count: int


def parse_raw_line(line: str, seen: dict | None = None) -> RawStack | None:
    """One line of ``py-spy record --format raw``; None when it does not parse. ``seen``:
    the frames and stacks of the lines before, shared (a file repeats the same frames on
    thousands of lines: 36 000 frame objects for 2 s of the tour, a few hundred distinct)."""
    line = line.rstrip("\r\n")
    if not line or len(line) > MAX_LINE:
        return None
    stack, _, count_text = line.rpartition(" ")
    if not stack or not count_text.isdigit():
        return None
    count = int(count_text)
    pos, pid = 0, None
    while stack.startswith("process ", pos):
        found = _PROCESS.match(stack, pos)
        if found is None:
            return None
        pid, pos = int(found.group(1)), found.end()
    tid = thread = None
    found = _THREAD.match(stack, pos)
    if found is not None:
        tid, thread, pos = found.group(1), found.group(2), found.end()
    if seen is None:
        seen = {}
    frames = []
    rest = stack[pos:]
    for part in _FRAME_SPLIT.split(rest) if rest else []:
        frame = seen.get(part)
        if frame is None:
            match = _FRAME.match(part)
            if match is None:
                return None
            name, path, lineno = match.groups()
            frame = Frame(_clip(name), _clip(path), int(lineno) if lineno else None)
            if len(seen) < MAX_SEEN:
                seen[part] = frame
        frames.append(frame)
    kept = tuple(frames[-MAX_FRAMES:])
    if len(seen) < MAX_SEEN:
        kept = seen.setdefault(kept, kept)
    return RawStack(pid, tid, _clip(thread) if thread else thread, kept, count)


def _records(text: str):
    """The raw file's records: one per line, except that a command line with newlines
    continues a record over several lines (until one ends with the count)."""
    pending: list[str] = []
    for line in text.split("\n"):
        if not pending and (_RECORD_END.search(line) or not line.startswith("process ")):
            yield line  # a whole record, or a line that no continuation can mend
            continue
        pending.append(line)
        if _RECORD_END.search(line) or len(pending) >= MAX_RECORD_LINES:
            yield "\n".join(pending)
            pending = []
    if any(part.strip() for part in pending):
        yield "\n".join(pending)


def parse_raw(text: str) -> tuple[list[RawStack], int]:
    """Every parsable record of a raw file, and how many did not parse."""
    stacks, bad = [], 0
    seen: dict = {}
    for line in _records(text):
        if not line.strip():
            continue
        parsed = parse_raw_line(line, seen)
        if parsed is None:
            bad += 1
        else:
            stacks.append(parsed)
    return stacks, bad


@dataclass(frozen=True)
class ThreadNow:
    """One thread's stack at the end of the sampling (``py-spy dump``)."""

    pid: int
    tid: int | None
    name: str | None
    active: bool | None
    holds_gil: bool | None
    frames: tuple[Frame, ...]  # innermost first

    def to_json(self) -> dict:
        return {"pid": self.pid, "tid": self.tid, "name": self.name, "active": self.active,
                "holds_gil": self.holds_gil, "stack": [f.to_json() for f in self.frames]}


def _str(value: object) -> str | None:
    return _clip(value) if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_dump(text: str, pid: int) -> list[ThreadNow]:
    """``py-spy dump --json`` of one process; threads that do not look right are skipped."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return []
    if not isinstance(doc, list):
        return []
    threads = []
    for item in doc[:MAX_THREADS]:
        if not isinstance(item, dict):
            continue
        frames = []
        for raw in (item.get("frames") or [])[:MAX_FRAMES]:
            if not isinstance(raw, dict):
                continue
            name, path = _str(raw.get("name")), _str(raw.get("filename"))
            if name is None or path is None:
                continue
            frames.append(Frame(name, path, _int(raw.get("line"))))
        active, gil = item.get("active"), item.get("owns_gil")
        threads.append(ThreadNow(
            pid=_int(item.get("pid")) or pid,
            tid=_int(item.get("os_thread_id")) or _int(item.get("thread_id")),
            name=_str(item.get("thread_name")),
            active=active if isinstance(active, bool) else None,
            holds_gil=gil if isinstance(gil, bool) else None,
            frames=tuple(frames),
        ))
    return threads


# -- aggregation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One row of a top list: a function (at its hottest line) or a line, with its share of
    the samples it is counted in. ``caller`` is the innermost frame in the user's own code
    when the entry itself is library code (``PIL.Image.decode`` called in ``dataset.py:48``)."""

    frame: Frame
    samples: int
    share: float  # 0-1
    caller: Frame | None = None

    def to_json(self) -> dict:
        out = {**self.frame.to_json(), "samples": self.samples, "share": round(self.share, 4)}
        if self.caller is not None:
            out["caller"] = self.caller.to_json()
        return out


@dataclass(frozen=True)
class ThreadActivity:
    """How much of the sampled time one thread was running."""

    tid: str | None
    name: str | None
    samples: int
    active: int

    @property
    def active_share(self) -> float:
        return min(1.0, self.active / self.samples) if self.samples else 0.0

    def to_json(self) -> dict:
        return {"tid": self.tid, "name": self.name, "samples": self.samples,
                "active_samples": self.active, "active_share": round(self.active_share, 4)}


@dataclass
class ProcessStacks:
    pid: int
    # "main": the process asked for; "worker": a process under a sampled Python process (a
    # DataLoader worker); "child": a Python process under one that is not Python (a job
    # started by a shell script or launcher).
    role: str
    parent: int | None = None
    samples: int = 0  # thread samples, idle and active
    active: int = 0  # thread samples in which the thread was running
    threads: int = 0
    top_functions: list[Entry] = field(default_factory=list)  # active samples, by function
    top_lines: list[Entry] = field(default_factory=list)  # active samples, by line
    idle_in: list[Entry] = field(default_factory=list)  # idle samples, by the line they wait on
    now: list[ThreadNow] = field(default_factory=list)  # every thread's stack at the end
    by_thread: list[ThreadActivity] = field(default_factory=list)  # busiest first

    @property
    def active_share(self) -> float | None:
        return min(1.0, self.active / self.samples) if self.samples else None

    def to_json(self) -> dict:
        share = self.active_share
        return {
            "pid": self.pid,
            "role": self.role,
            "parent": self.parent,
            "threads": self.threads,
            "samples": self.samples,
            "active_samples": self.active,
            "active_share": None if share is None else round(share, 4),
            "top_functions": [e.to_json() for e in self.top_functions],
            "top_lines": [e.to_json() for e in self.top_lines],
            "idle_in": [e.to_json() for e in self.idle_in],
            "thread_activity": [t.to_json() for t in self.by_thread],
            "threads_now": [t.to_json() for t in self.now],
        }


@dataclass
class StackReport:
    pid: int
    seconds: float
    rate: int
    processes: list[ProcessStacks]  # the main process first, then workers by pid
    sample_errors: int = 0  # samples py-spy could not read (a stack changing under it)
    unparsed: int = 0  # raw lines that did not parse
    notes: list[str] = field(default_factory=list)  # e.g. "pid 12 ended during sampling"

    @property
    def main(self) -> ProcessStacks | None:
        return next((p for p in self.processes if p.role == "main"), None)

    @property
    def workers(self) -> list[ProcessStacks]:
        return [p for p in self.processes if p.role == "worker"]

    @property
    def others(self) -> list[ProcessStacks]:
        """Every process but the main one: workers, and children of a non-Python main."""
        return [p for p in self.processes if p.role != "main"]

    def top(self) -> tuple[ProcessStacks, Entry] | None:
        """The function that took the most active samples in the whole process tree."""
        best = None
        for proc in self.processes:
            if proc.top_functions:
                entry = proc.top_functions[0]
                if best is None or entry.samples > best[1].samples:
                    best = (proc, entry)
        return best

    def to_json(self) -> dict:
        top = self.top()
        return {
            "pid": self.pid,
            "seconds": self.seconds,
            "rate": self.rate,
            "top": None if top is None else {"pid": top[0].pid, "role": top[0].role,
                                             **top[1].to_json()},
            "processes": [p.to_json() for p in self.processes],
            "sample_errors": self.sample_errors,
            "unparsed_lines": self.unparsed,
            "notes": list(self.notes),
        }


def _user_frame(frames: tuple[Frame, ...]) -> Frame | None:
    """The innermost frame outside installed libraries (frames outermost first)."""
    for frame in reversed(frames):
        if not frame.is_library:
            return frame
    return None


def _tops(stacks: Iterable[RawStack], total: int) -> tuple[list[Entry], list[Entry]]:
    """Top functions (each at its hottest line) and top lines of these stacks' leaf frames."""
    by_line: Counter[Frame] = Counter()
    by_function: Counter[tuple[str, str]] = Counter()
    callers: dict[Frame, Counter[Frame]] = {}
    for s in stacks:
        if not s.frames:
            continue
        leaf = s.frames[-1]
        by_line[leaf] += s.count
        by_function[(leaf.file, leaf.function)] += s.count
        if leaf.is_library:
            caller = _user_frame(s.frames)
            if caller is not None:
                callers.setdefault(leaf, Counter())[caller] += s.count
    if total <= 0:
        return [], []

    def caller_of(frames: Iterable[Frame]) -> Frame | None:
        merged: Counter[Frame] = Counter()
        for frame in frames:
            merged.update(callers.get(frame, {}))
        return merged.most_common(1)[0][0] if merged else None

    lines = [Entry(frame, n, n / total, caller_of([frame]))
             for frame, n in sorted(by_line.items(), key=lambda kv: (-kv[1], kv[0].file,
                                                                     kv[0].line or 0))[:TOP]]
    functions = []
    for (path, name), n in sorted(by_function.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]:
        same = [f for f in by_line if f.file == path and f.function == name]
        hottest = max(same, key=lambda f: (by_line[f], -(f.line or 0)))
        functions.append(Entry(hottest, n, n / total, caller_of(same)))
    return functions, lines


def build_report(pid: int, seconds: float, rate: int, active: list[RawStack],
                 everything: list[RawStack] | None,
                 dumps: Mapping[int, list[ThreadNow]] | None = None,
                 sample_errors: int = 0, unparsed: int = 0,
                 parents: Mapping[int, int] | None = None) -> StackReport:
    """Combine the active-only recording and the one with idle threads (``everything``;
    None when it was not made) into per-process figures. ``parents``: pid -> parent pid of
    the processes sampled (None: every one is taken for a worker of ``pid``).

    The two recordings ran side by side at the same rate, so a stack's idle samples are its
    samples in ``everything`` less those in ``active``."""
    pids = {s.pid if s.pid is not None else pid for s in [*active, *(everything or [])]}
    pids |= set(dumps or {})
    processes = []
    for p in sorted(pids, key=lambda x: (x != pid, x)):
        mine = [s for s in active if (s.pid if s.pid is not None else pid) == p]
        parent = (parents or {}).get(p, pid if p != pid else None)
        role = "main" if p == pid else ("worker" if parent in pids else "child")
        proc = ProcessStacks(pid=p, role=role, parent=parent)
        proc.active = sum(s.count for s in mine)
        proc.top_functions, proc.top_lines = _tops(mine, proc.active)
        if everything is not None:
            whole = [s for s in everything if (s.pid if s.pid is not None else pid) == p]
            proc.samples = max(sum(s.count for s in whole), proc.active)
            proc.threads = len({s.tid for s in whole} | {s.tid for s in mine})
            busy: Counter[tuple] = Counter()
            for s in mine:
                busy[(s.tid, s.frames)] += s.count
            idle = []
            for s in whole:
                left = s.count - busy.pop((s.tid, s.frames), 0)
                # Two samplers never land on exactly the same ticks: a stack that is nearly
                # always active leaves a small difference that is noise, not waiting.
                if left >= max(IDLE_MIN_SAMPLES, IDLE_MIN_SHARE * s.count):
                    idle.append(RawStack(s.pid, s.tid, s.thread, s.frames, left))
            proc.by_thread = _thread_activity(whole, mine)
            if proc.samples - proc.active >= max(IDLE_MIN_SAMPLES,
                                                 IDLE_MIN_PROCESS_SHARE * proc.samples):
                _, proc.idle_in = _tops(idle, sum(s.count for s in idle))
        else:
            proc.samples = proc.active
            proc.threads = len({s.tid for s in mine})
        proc.now = list((dumps or {}).get(p, []))
        if proc.now:
            proc.threads = max(proc.threads, len(proc.now))
        processes.append(proc)
    return StackReport(pid, seconds, rate, processes, sample_errors, unparsed)


def _thread_activity(whole: list[RawStack], active: list[RawStack]) -> list[ThreadActivity]:
    samples: Counter[str | None] = Counter()
    busy: Counter[str | None] = Counter()
    names: dict[str | None, str | None] = {}
    for s in whole:
        samples[s.tid] += s.count
        names.setdefault(s.tid, s.thread)
    for s in active:
        busy[s.tid] += s.count
        names.setdefault(s.tid, s.thread)
    threads = [ThreadActivity(tid, names.get(tid), max(samples[tid], busy[tid]), busy[tid])
               for tid in names]
    return sorted(threads, key=lambda t: (-t.active_share, -t.samples, str(t.tid)))


# -- the "where" line of a finding ---------------------------------------------------------


def _entry_text(entry: Entry) -> str:
    text = f"{entry.frame.function} ({entry.frame.location()})"
    if entry.caller is not None:
        text += f" in {entry.caller.location()}"
    return text


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def where_line(report: StackReport, finding_id: str | None = None) -> str | None:
    """The one line a finding shows: its top function and line, and its share.

    For a stall the CPU time is the story: the workers' top function when they were busier
    than the main process (a DataLoader stall with workers), else the main process's. For
    ``hung`` nothing runs: where the main thread waits. When the process itself runs no
    Python (a launcher), its busiest Python child stands for it."""
    main, workers = report.main, report.workers
    if main is None or not main.samples:
        children = [p for p in report.others if p.role == "child"]
        if children:
            main = max(children, key=lambda p: (p.active, p.samples))
    if finding_id == "hung":
        if main is not None:
            thread = next((t for t in main.now if t.name == "MainThread"),
                          main.now[0] if main.now else None)
            if thread is not None and thread.frames:
                leaf = thread.frames[0]
                text = f"{thread.name or 'a thread'} waits in {leaf.function} ({leaf.location()})"
                user = next((f for f in thread.frames if not f.is_library), None)
                if user is not None and user != leaf:
                    text += f" in {user.location()}"
                return text
            if main.idle_in:
                top = main.idle_in[0]
                return f"waits in {_entry_text(top)}, {_percent(top.share)} of idle samples"
    busy_workers = sum(w.active for w in workers)
    if workers and busy_workers > (main.active if main else 0):
        merged, _ = _tops(_as_stacks(workers), busy_workers)
        if merged:
            return f"{_entry_text(merged[0])}, {_percent(merged[0].share)} of worker samples"
    if main is not None and main.top_functions:
        top = main.top_functions[0]
        whose = "main-process" if main.role == "main" else f"pid {main.pid}"
        return f"{_entry_text(top)}, {_percent(top.share)} of {whose} samples"
    if main is not None and main.idle_in:
        top = main.idle_in[0]
        return f"idle, waiting in {_entry_text(top)}"
    return None


def _as_stacks(procs: Iterable[ProcessStacks]) -> list[RawStack]:
    """Top entries of several processes as stacks again, to rank them together."""
    out = []
    for proc in procs:
        for entry in proc.top_lines:
            frames = (entry.caller, entry.frame) if entry.caller is not None else (entry.frame,)
            out.append(RawStack(proc.pid, None, None, frames, entry.samples))
    return out
