"""Out-of-memory forensics inside the training process: when an allocation fails, write what
held the memory before the job dies (``gputop memory --last-oom PID``, and the monitor for a
process that died of it).

Two ways in, one way out (``OomWatch.observe``, which builds and writes the report):

* CUDA: the caching allocator's out-of-memory observer
  (``torch._C._cuda_attach_out_of_memory_observer``, attached once CUDA is initialised, through
  ``torch.cuda._lazy_call``): called on the allocating thread, before ``OutOfMemoryError`` is
  raised, with the device, the size asked for and the device's total and free bytes; the
  report then has the allocator's segments and, when the allocator's history is on
  (``GPUTOP_MEMORY_HISTORY=N`` keeps it on with N events), the lines holding the live blocks;
* any device: an uncaught ``torch.OutOfMemoryError``, or the CPU allocator's failure (a
  ``RuntimeError`` "DefaultCPUAllocator: can't allocate memory", which has no observer),
  seen by the agent's ``sys.excepthook`` / ``threading.excepthook`` (chained before the
  previous ones) with the exception's traceback, as the process is about to end.

A CUDA OOM seen both ways is one report: the uncaught exception marks it fatal and adds its
traceback. A process out of host memory may not have the few MB the report needs: the agent
holds ``RESERVE_BYTES`` of address space (untouched pages: no resident memory) and lets go
of it before writing; each part of the report (the census of tensors, the allocator's
segments, the model's storages) that still fails is left out with a note. Bounded: at most ``MAX_REPORTS`` per process, one per ``MIN_INTERVAL_S`` unless
fatal, each a few KB (the report's lists are capped); the report goes to the capture
directory, and a pointer ``<pid>.oom`` beside the agent's socket names it for the monitor.

Training process side: standard library only; torch is never imported here.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from gputop.agent.memory.events import snapshot_frames, user_site
from gputop.agent.memory.state import (
    cuda_allocator,
    header,
    model_storages,
    param_device,
    process_memory,
    write_report,
)
from gputop.core.protocol import pid_namespace, socket_dir, socket_name

MAX_REPORTS = 20
RESERVE_BYTES = 8 << 20  # address space let go of when the report is written
MIN_INTERVAL_S = 10.0
MAX_FRAMES = 32
MAX_MESSAGE = 1000
HISTORY_ENV = "GPUTOP_MEMORY_HISTORY"
_CPU_FAILURE = re.compile(r"DefaultCPUAllocator: can't allocate memory|"
                          r"can't allocate memory: you tried to allocate")
_ASKED = re.compile(r"(?:you tried to allocate|Tried to allocate) ([0-9.]+) ?"
                    r"(bytes|B|KiB|MiB|GiB|TiB)\b")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and bool(_CPU_FAILURE.search(str(exc)[:2000]))


def asked_bytes(message: str) -> int | None:
    """The allocation that failed, from PyTorch's message ("Tried to allocate 2.00 GiB",
    "you tried to allocate 67108864 bytes")."""
    found = _ASKED.search(message)
    if found is None:
        return None
    try:
        return int(float(found.group(1)) * _UNITS[found.group(2)])
    except (ValueError, KeyError):
        return None


def pointer_path(pid: int | None = None) -> Path:
    """``<socket dir>/<pid>.oom``: the path of the process's last OOM report, for the
    monitor (the report itself lives in the capture directory, which the job may have set)."""
    name = socket_name(os.getpid() if pid is None else pid, pid_namespace())
    return socket_dir() / (name.removesuffix(".sock") + ".oom")


def _frames(summary: traceback.StackSummary) -> list[tuple[str, int, str]]:
    """Innermost first, without gputop's own frames."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [(f.filename, f.lineno or 0, f.name) for f in reversed(summary)
            if not f.filename.startswith(here)][:MAX_FRAMES]


class OomWatch:
    def __init__(self, telemetry: Any, memory: Any, started_at: float) -> None:
        self.telemetry = telemetry
        self.memory = memory  # the memory captures: the last one's growth goes in the report
        self.started_at = started_at
        self.reports = 0
        self.last: tuple[float, dict[str, Any], Path] | None = None
        self._lock = threading.Lock()
        self._previous: tuple[Any, Any] | None = None
        self._attached = False
        self._reserve: bytearray | None = None

    # --- installing -------------------------------------------------------------------------------

    def install(self) -> None:
        if self._previous is not None:
            return
        try:
            self._reserve = bytearray(RESERVE_BYTES)  # zero pages: address space, not RSS
        except MemoryError:
            self._reserve = None
        self._previous = (sys.excepthook, threading.excepthook)
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook

    def uninstall(self) -> None:
        if self._previous is None:
            return
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous[0]
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._previous[1]
        self._previous = None

    def torch_imported(self, torch: Any) -> None:
        """Attach to the CUDA allocator once CUDA is initialised (never initialise it)."""
        lazy = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
        if lazy is not None and hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
            lazy(self._attach_cuda)

    def _attach_cuda(self) -> None:
        try:
            torch = sys.modules["torch"]
            if self._attached:
                return
            torch._C._cuda_attach_out_of_memory_observer(self._cuda_oom)
            self._attached = True
            entries = os.environ.get(HISTORY_ENV, "").strip()
            if entries.isdigit() and int(entries) > 0 and not torch._C._cuda_isHistoryEnabled():
                torch.cuda.memory._record_memory_history(
                    enabled="all", context="alloc", stacks="python",
                    max_entries=min(int(entries), 10_000_000))
        except Exception as exc:
            self.telemetry.record_error(exc)

    # --- the two ways in ------------------------------------------------------------------------

    def _cuda_oom(self, device: int, requested: int, device_total: int, device_free: int
                  ) -> None:
        self.observe(f"cuda:{device}", requested, _frames(traceback.extract_stack()), None,
                     fatal=False, device_total=device_total, device_free=device_free)

    def _excepthook(self, exc_type: Any, exc: BaseException, tb: Any) -> None:
        oom = False
        try:
            if exc is not None and is_oom(exc):
                oom = True
                self._uncaught(exc, tb)
        finally:
            previous = self._previous[0] if self._previous else sys.__excepthook__
            previous(exc_type, exc, tb)
            if oom:
                self._tell()

    def _thread_excepthook(self, args: Any) -> None:
        oom = False
        try:
            if args.exc_value is not None and is_oom(args.exc_value):
                oom = True
                self._uncaught(args.exc_value, args.exc_traceback)
        finally:
            previous = self._previous[1] if self._previous else threading.__excepthook__
            previous(args)
            if oom:
                self._tell()

    def _tell(self) -> None:
        """After the job's own traceback: one line saying that the report was written, where,
        and how to read it (the job is ending: nobody would look for it otherwise)."""
        last = self.last
        if last is None or time.time() - last[0] > 60.0:
            return
        try:
            print(f"gputop: out-of-memory report written to {last[2]}; read it with "
                  f"`gputop memory --last-oom {os.getpid()}`", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    def _uncaught(self, exc: BaseException, tb: Any) -> None:
        try:
            self._record_uncaught(exc, tb)
        except Exception as error:  # never in the way of the job's own traceback
            self.telemetry.record_error(error)

    def _record_uncaught(self, exc: BaseException, tb: Any) -> None:
        message = " ".join(str(exc).split())[:MAX_MESSAGE]
        frames = _frames(traceback.extract_tb(tb))
        last = self.last
        if last is not None and time.time() - last[0] < 60.0 and last[1]["device"].startswith(
                "cuda") and not last[1]["oom"]["fatal"]:
            # The allocator's observer wrote it a moment ago: mark it fatal, with the traceback.
            self._rewrite(last, message, frames, type(exc).__name__)
            return
        device = param_device(self.telemetry.leader()) or "cpu"
        if _CPU_FAILURE.search(message):
            device = "cpu"
        self.observe(device, asked_bytes(message), frames, message, fatal=True,
                     exception=type(exc).__name__)

    # --- the way out ----------------------------------------------------------------------------

    def observe(self, device: str, requested: int | None, frames: list[tuple[str, int, str]],
                message: str | None, *, fatal: bool, exception: str = "OutOfMemoryError",
                device_total: int | None = None, device_free: int | None = None
                ) -> Path | None:
        """Write the OOM report; never raises (the job is failing already)."""
        try:
            with self._lock:
                now = time.time()
                if self.reports >= MAX_REPORTS or (not fatal and self.last is not None
                                                   and now - self.last[0] < MIN_INTERVAL_S):
                    return None
                self._reserve = None  # room for the report, when memory is what ran out
                started = time.perf_counter()
                report = self._report(device, requested, frames, message, fatal, exception,
                                      device_total, device_free)
                report["report_s"] = round(time.perf_counter() - started, 6)
                path = self._write(report)
                self.reports += 1
                self.last = (now, report, path)
                if not fatal:
                    try:
                        self._reserve = bytearray(RESERVE_BYTES)
                    except MemoryError:
                        pass
                return path
        except Exception as exc:
            self.telemetry.record_error(exc)
            return None

    def _report(self, device: str, requested: int | None, frames: list[tuple[str, int, str]],
                message: str | None, fatal: bool, exception: str, device_total: int | None,
                device_free: int | None) -> dict[str, Any]:
        torch = sys.modules.get("torch")
        report = header("oom", device, self.started_at)
        where = user_site(frames)
        report["oom"] = {
            "requested": requested, "exception": exception, "fatal": fatal,
            "message": message, "step": self.telemetry.steps,
            "where": None if where is None else {"file": where.file, "line": where.line,
                                                  "function": where.function,
                                                  "code": _code(where.file, where.line)},
            "stack": _stack(frames),
            "device_total": device_total, "device_free": device_free,
        }
        report["allocator"] = {"caching": False}
        report["growth"], report["live_lines"], report["notes"] = [], [], []
        report["source"] = "process"
        cuda = device.startswith("cuda") and torch is not None and torch.cuda.is_initialized()

        def part(name: str, read: Any) -> None:
            try:
                read()
            except Exception as exc:  # MemoryError included: the rest is still written
                report["notes"].append(f"{name} left out: {type(exc).__name__}: {exc}"[:300])

        part("the model's storages", lambda: report.__setitem__(
            "model", model_storages(self.telemetry.leader(), device).totals()))
        part("the process's memory", lambda: report.__setitem__("process", process_memory()))
        if cuda:
            part("the allocator's segments", lambda: self._cuda_part(torch, device, report))
        if torch is not None:  # what held the memory, as far as Python can see
            from gputop.agent.memory.keepers import census

            part("the census of tensors", lambda: report.__setitem__(
                "census", census(torch, device)))
        last = getattr(self.memory, "last", None)
        if last is not None and last.get("device") == device:
            report["growth"] = last.get("growth") or []
            report["growth_from"] = {"time": last.get("time"),
                                     "report": getattr(self.memory, "last_path", None)}
        report["cut"] = []
        return report

    @staticmethod
    def _cuda_part(torch: Any, device: str, report: dict[str, Any]) -> None:
        index = int(device.partition(":")[2] or 0)
        snapshot = torch.cuda.memory._snapshot()
        report["allocator"] = cuda_allocator(torch, index, snapshot)
        report["live_lines"] = _live_lines(snapshot, index)
        report["source"] = "allocator-state"

    def _write(self, report: dict[str, Any]) -> Path:
        from gputop.agent.trace_export import prepare_capture_dir

        path = write_report(prepare_capture_dir(None), report, "oom")
        try:  # the pointer is a convenience: the report stands without it
            pointer = pointer_path()
            staged = pointer.with_name(f".{pointer.name}.{threading.get_ident()}")
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(str(path) + "\n")
            os.replace(staged, pointer)
        except OSError:
            pass
        return path

    def _rewrite(self, last: tuple[float, dict[str, Any], Path], message: str,
                 frames: list[tuple[str, int, str]], exception: str) -> None:
        try:
            with self._lock:
                report = last[1]
                report["oom"].update({"fatal": True, "message": message,
                                      "exception": exception})
                if frames:
                    report["oom"]["stack"] = _stack(frames)
                path = write_report(last[2].parent, report, "oom")
                os.replace(path, last[2])
        except Exception as exc:
            self.telemetry.record_error(exc)


def _stack(frames: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
    return [{"file": f, "line": n, "function": fn, "code": _code(f, n)} for f, n, fn in frames]


def _code(file: str, line: int) -> str:
    import linecache

    try:
        return linecache.getline(file, line).strip()[:200]
    except Exception:
        return ""


def _live_lines(snapshot: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """What the live blocks' allocations came from (when the history recorded their frames),
    by line, largest first."""
    by: dict[tuple[str, int, str], int] = {}
    for segment in snapshot.get("segments") or ():
        if segment.get("device", index) != index:
            continue
        for block in segment.get("blocks") or ():
            if block.get("state") != "active_allocated":
                continue
            site = user_site(snapshot_frames(block.get("frames")))
            key = (site.file, site.line, site.function) if site else ("", 0, "")
            by[key] = by.get(key, 0) + int(block.get("size") or 0)
    top = sorted(by.items(), key=lambda kv: -kv[1])[:16]
    return [{"file": k[0] or None, "line": k[1] or None, "function": k[2] or None,
             "code": _code(k[0], k[1]) if k[0] else None, "bytes": n} for k, n in top]
