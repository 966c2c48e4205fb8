"""PyTorch's Debug Server dumps (``torch.distributed.debug.start_debug_server(dump_dir=...)``)
read as untrusted input, and the hang they tell.

Rank 0's frontend writes ``stacks_<YYYYmmdd_HHMMSS>.txt`` into ``dump_dir`` every
``dump_interval``: each rank's Python threads as ``faulthandler`` prints them, under
``=== Rank N: <worker address> ===``. The newest one is read (bounded in size, ranks and
frames); each rank's main thread says whether it is inside a ``torch.distributed`` collective
(its innermost ``distributed_c10d.py`` frame names it) or elsewhere. The ranks elsewhere, while
others wait in a collective, hang the job: "rank 2 is at job.py:49 in main, in no collective;
ranks 0, 1, 3 wait in all_reduce (job.py:50)". Pure: no torch, no textual.
"""

from __future__ import annotations

import os
import re
import stat
from collections import Counter
from dataclasses import dataclass

from gputop.diagnostics.hang.attribution import HangReport
from gputop.diagnostics.hang.stacks import MAX_FRAMES, StackFrame
from gputop.diagnostics.hang.views import HangFinding, _ranks_h

MAX_STACKS_BYTES = 32 * 1024 * 1024  # a stacks file larger than this is refused unread
MAX_RANKS = 1 << 16  # rank sections read from one file
_NAME = re.compile(r"^stacks_(\d{8}_\d{6})\.txt$")
_RANK = re.compile(r"^=== Rank (\d{1,6}): (.{0,300}?) ===$")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.{1,1024})", line (\d{1,9}) in (.{1,256})$')
_C10D = "distributed_c10d.py"


class StacksError(Exception):
    """A stacks file that cannot be read: one line naming it."""


@dataclass(frozen=True)
class RankThreads:
    rank: int
    address: str
    threads: tuple[tuple[StackFrame, ...], ...]  # innermost first
    error: str | None = None  # the worker's error reply, when it gave no stack

    def main(self) -> tuple[StackFrame, ...]:
        """The thread that runs the training loop: the one whose outermost frame is the
        script's ``<module>``, else the deepest one."""
        with_module = [t for t in self.threads if t and t[-1].function == "<module>"]
        pool = with_module or [t for t in self.threads if t]
        return max(pool, key=len) if pool else ()


def newest_stacks(folder: str) -> str | None:
    """The newest ``stacks_*.txt`` of a Debug Server dump_dir, or None."""
    try:
        names = [e.name for e in os.scandir(folder) if _NAME.match(e.name) and e.is_file()]
    except OSError:
        return None
    return os.path.join(folder, max(names)) if names else None


def read_stacks(path: str, max_bytes: int = MAX_STACKS_BYTES) -> list[RankThreads]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise StacksError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise StacksError(f"{path}: not a regular file: refused")
        if st.st_size > max_bytes:
            raise StacksError(f"{path}: {st.st_size >> 20} MiB is over the bound "
                              f"({max_bytes >> 20} MiB): refused unread")
        text = fh.read(max_bytes + 1).decode("utf-8", "replace")
    return parse_stacks(text)


def parse_stacks(text: str) -> list[RankThreads]:
    ranks: list[RankThreads] = []
    rank, addr = None, ""
    threads: list[list[StackFrame]] = []
    error: str | None = None

    def close() -> None:
        if rank is not None and len(ranks) < MAX_RANKS:
            ranks.append(RankThreads(rank, addr, tuple(tuple(t) for t in threads), error))

    for line in text.splitlines():
        m = _RANK.match(line)
        if m:
            close()
            rank, addr, threads, error = int(m.group(1)), m.group(2), [], None
            continue
        if rank is None:
            continue
        if _THREAD.match(line):
            threads.append([])
        elif (f := _FRAME.match(line)) and threads:
            if len(threads[-1]) < MAX_FRAMES:
                threads[-1].append(StackFrame(function=f.group(3), file=f.group(1),
                                              line=int(f.group(2))))
        elif line.startswith("Error:") and not threads:
            error = line[:200]
    close()
    seen: set[int] = set()
    return [r for r in ranks if not (r.rank in seen or seen.add(r.rank))]  # type: ignore[func-returns-value]


def _user(frames: tuple[StackFrame, ...]) -> StackFrame | None:
    return next((f for f in frames if not f.is_library), None)


def _at(f: StackFrame | None) -> str:
    return f"{f.file.rsplit('/', 1)[-1]}:{f.line}" if f is not None else "?"


def attribute_stacks(ranks: list[RankThreads], name: str, dumped_at: float | None) -> HangReport:
    """The hang the ranks' stacks tell: ranks in no collective while others wait in one."""
    waiting: dict[int, tuple[str, StackFrame | None]] = {}  # rank -> (collective, user frame)
    elsewhere: dict[int, StackFrame | None] = {}
    errors: dict[int, str] = {}
    for r in ranks:
        frames = r.main()
        if not frames:
            errors[r.rank] = r.error or "no Python stack"
            continue
        c10d = next((f for f in frames if f.file.endswith(_C10D)), None)
        if c10d is not None:
            waiting[r.rank] = (c10d.function, _user(frames))
        else:
            elsewhere[r.rank] = _user(frames) or frames[0]
    notes = [f"rank {r}: no stack: {e}" for r, e in sorted(errors.items())][:16]
    lines: dict[int, str] = {}
    for r, f in elsewhere.items():
        lines[r] = f"{_at(f)} in {f.function if f else '?'}, in no collective"
    for r, (op, f) in waiting.items():
        lines[r] = f"waits in {op}" + (f" ({_at(f)})" if f else "")
    culprits = sorted(elsewhere) if waiting else []
    culprits += sorted(r for r in errors if waiting and r not in culprits)
    findings = []
    if culprits:
        ops = Counter(op for op, _ in waiting.values())
        op = ops.most_common(1)[0][0]
        site = next((f for o, f in waiting.values() if o == op and f), None)
        said = "; ".join(f"rank {r} is at {lines[r]}" if r in lines else f"rank {r}: {errors[r]}"
                         for r in culprits[:4])
        title = (f"{said}; {_ranks_h(waiting)} wait in {op}"
                 + (f" ({_at(site)})" if site else ""))
        findings.append(HangFinding(
            id="hang", severity="critical", title=title,
            evidence=f"the Debug Server's {os.path.basename(name)}: " + "; ".join(
                f"rank {r}: {line}" for r, line in sorted(lines.items())[:16]),
            fix=(f"look at what {_ranks_h(culprits)} {'does' if len(culprits) == 1 else 'do'} "
                 f"at that line instead of calling {op}: every rank must call the same "
                 "collectives in the same order"),
            next_step="the Debug Server's frontend (/fr_trace) for every rank's collectives",
            ranks=tuple(culprits), waiting_ranks=tuple(sorted(waiting)),
            collective=op, rank_lines=tuple(sorted(lines.items())), pid=None))
    verdict = "hang" if findings else "healthy"
    reason = None if findings else (
        "every rank waits in a collective: the stacks alone cannot tell which one hangs (read "
        "the Flight Recorder: fr_trace_*)" if waiting and not elsewhere
        else "no rank waits in a collective")
    return HangReport(verdict=verdict, findings=tuple(findings),
                      ranks=tuple(sorted(r.rank for r in ranks)), missing_ranks=(),
                      notes=tuple(notes), healthy_reason=reason, measured_at=dumped_at,
                      files={r.rank: name for r in ranks}, world_size=len(ranks) or None)
