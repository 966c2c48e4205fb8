"""Memory captures inside the training process (`m` in the monitor, `gputop memory PID`): which
source lines' allocations grow, what the step's peak is made of, reserved versus allocated.

Asked for on the server thread, recorded on the training thread between optimizer-step
boundaries (one warm-up step, then N steps), read on an analysis thread. One capture of either
kind (this or a profiler capture) runs at a time. The instrument:

* CUDA (the optimizer's parameters live on a CUDA device): the caching allocator's history,
  ``_record_memory_history(enabled="all", context="alloc", stacks="python",
  max_entries=HISTORY_ENTRIES)``, from the first boundary; ``_snapshot()`` after the last, then
  off again (left as it was when the job records its own history);
* otherwise: torch.profiler with ``profile_memory=True`` (no Python tracer), started and stopped
  on the training thread like a capture's, with a dispatch mode on that thread that marks each
  operator with the user line that called it (``memory_sites``).

Then, on the analysis thread: the events (``memory_events``), the summary (``memory_summary``),
what keeps the lines that grew (``memory_keepers``), and the report file (``memory_state``),
named in the reply. Bounded like a capture (README "Where does my memory go"): at most
``MAX_RECORD_S`` of recording, a recorded step ``MAX_TRACER_SLOWDOWN`` times slower than the
job's p95 ends it, the history holds ``HISTORY_ENTRIES`` events, reading them stops after
``ANALYSIS_BUDGET_S``, and the report holds the top ``MAX_LINES`` lines of each list.

torch is only imported here lazily, and only when the program has imported it already.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputop.agent import quiet
from gputop.agent.capture_request import integer, param
from gputop.agent.memory.events import Sites, allocator_events, profiler_events
from gputop.agent.memory.sites import PREFIX, enter, leave, leave_after_fork, site_marks
from gputop.agent.memory.state import (
    cuda_allocator,
    header,
    model_storages,
    param_device,
    process_memory,
    write_report,
)
from gputop.agent.memory.summary import growth, peak, reserved_at
from gputop.agent.profiling import (
    MAX_RECORD_S,
    MAX_TRACER_SLOWDOWN,
)
from gputop.agent.telemetry import StepTelemetry
from gputop.agent.trace_export import CaptureError, prepare_capture_dir

MAX_STEPS = 100
DEFAULT_STEPS = 3
DEFAULT_TIMEOUT_S = 60.0
HISTORY_ENTRIES = 20_000  # the CUDA allocator's ring of events while recording
ANALYSIS_BUDGET_S = 10.0  # reading the profiler's events, at most
GIVE_UP_S = 5.0  # after a cancel, how long to wait for the step that stops the recording


def parse_memory_request(message: dict[str, Any]) -> dict[str, Any]:
    """Validate a ``memory`` request (or CaptureError)."""
    unknown = sorted(repr(str(k)[:40]) for k in message if k not in (
        "cmd", "steps", "timeout", "out"))
    if unknown:
        raise CaptureError("bad-request", f"unknown field(s) for memory: {', '.join(unknown)}")
    steps = integer(message, "steps", 1, MAX_STEPS)
    timeout = param(message, "timeout", 0.1, 86400.0)
    out = message.get("out")
    if out is not None and (not isinstance(out, str) or not out or len(out) > 4096
                            or not out.isprintable() or not os.path.isabs(out)):
        raise CaptureError("bad-request", "out must be an absolute directory path")
    return {"steps": DEFAULT_STEPS if steps is None else steps,
            "timeout": DEFAULT_TIMEOUT_S if timeout is None else timeout, "out": out}


class MemoryJob:
    """One memory capture; fields are read by ``status`` on other threads."""

    def __init__(self, params: dict[str, Any], directory: Path) -> None:
        self.params = params
        self.directory = directory
        self.state = "waiting"  # waiting -> warmup -> recording -> analysing (or cancelling)
        self.requested_at = time.monotonic()
        self.marks: list[int] = []  # time.time_ns() at each boundary
        self.perf: list[float] = []  # perf_counter at each boundary
        self.device = "cpu"
        self.index: int | None = None  # the CUDA device's index
        self.profiler: Any = None
        self.mode: Any = None  # memory_sites' dispatch mode, on the training thread
        self.sites = Sites()
        self.train_thread: int | None = None
        self.our_history = False  # the allocator's history was turned on by us
        self.quiet = False  # gputop.agent.quiet is on for this capture
        self.baseline: int | None = None  # CUDA: allocated bytes at the first boundary
        self.reserved_start: int | None = None
        self.storages: Any = None
        self.first_step: int | None = None
        self.usual_step_s: float | None = None
        self.finish_reason: str | None = None
        self.cancel_code: str | None = None
        self.cancel_message = ""
        self.blocked_s = 0.0
        self.notes: list[str] = []
        self.cut: list[str] = []
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None
        self.reply_sent = threading.Event()

    @property
    def recorded(self) -> int:
        return max(0, len(self.marks) - 2)

    @property
    def running(self) -> bool:
        """An instrument is on: the profiler and the dispatch mode (both left on the training
        thread only) or the allocator's history."""
        return self.profiler is not None or self.mode is not None or self.our_history

    def progress(self) -> dict[str, Any]:
        return {"state": self.state, "kind": "memory", "mode": "steps",
                "steps_total": self.params["steps"],
                "steps_done": min(self.recorded, self.params["steps"]), "warmup": 1,
                "elapsed_s": round(time.monotonic() - self.requested_at, 3)}


class MemoryCapture:
    """At most one memory capture at a time, never beside a profiler capture."""

    def __init__(self, telemetry: StepTelemetry, hooks_ready: Callable[[], str | None],
                 captures: Any, started_at: float) -> None:
        self.telemetry = telemetry
        self._hooks_ready = hooks_ready
        self.captures = captures  # the profiler captures' controller: one capture at a time
        self.started_at = started_at
        self.job: MemoryJob | None = None
        self.last: dict[str, Any] | None = None  # the last report (for an OOM report)
        self.last_path: str | None = None

    # --- server thread -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        job = self.job
        return job.progress() if job is not None else {"state": "idle"}

    def busy(self) -> str | None:
        job = self.job
        if job is None:
            return None
        return (f"a memory capture is already running ({job.state}, "
                f"{time.monotonic() - job.requested_at:.1f} s)")

    def request(self, message: dict[str, Any], client_gone: Callable[[], bool]
                ) -> dict[str, Any]:
        """Serve one ``memory`` request, blocking this connection's thread until done."""
        try:
            params = parse_memory_request(message)
            why_not = self._hooks_ready()
            if why_not is not None:
                raise CaptureError("unsupported", why_not)
            directory = prepare_capture_dir(params["out"])
            job = MemoryJob(params, directory)
            job.usual_step_s = self.telemetry.status().get("step_time_p95_s")
            with self.captures._lock:  # one capture at a time, of either kind
                if self.captures.job is not None:
                    raise CaptureError("busy", self.captures._busy_message())
                if self.job is not None:
                    raise CaptureError("busy", self.busy() or "busy")
                self.job = job
                self.telemetry.on_step = self._on_step
        except CaptureError as exc:
            return _error(exc.code, str(exc))
        return self._wait(job, client_gone)

    def _wait(self, job: MemoryJob, client_gone: Callable[[], bool]) -> dict[str, Any]:
        timeout = job.params["timeout"]
        give_up_at: float | None = None
        steps_at_request = self.telemetry.steps
        first_wait = min(timeout / 2, max(10.0, 3.0 * (
            self.telemetry.status().get("step_time_p95_s") or 0.0)))
        while not job.done.wait(0.05):
            now = time.monotonic()
            waited = now - job.requested_at
            if job.cancel_code is None and client_gone():
                self.cancel("cancelled", "the client went away")
            elif (job.cancel_code is None and job.state == "waiting" and waited > first_wait
                  and self.telemetry.steps == steps_at_request):
                self.cancel("no-steps", f"no optimizer step in {waited:.0f} s (inference, or "
                            "a stuck job?): a memory capture records whole steps")
            elif job.cancel_code is None and waited > timeout:
                if job.recorded >= 1 and job.finish_reason is None:
                    job.finish_reason = f"the capture's {timeout:g} s deadline passed"
                elif job.finish_reason is None:
                    self.cancel("timeout", f"only {job.recorded} of {job.params['steps']} "
                                f"steps recorded in {timeout:g} s; try fewer --steps or a "
                                "longer --timeout")
            if (job.cancel_code is not None or job.finish_reason is not None) \
                    and job.state != "analysing":
                if give_up_at is None:
                    give_up_at = now + max(GIVE_UP_S, 2.0 * (
                        self.telemetry.status().get("step_time_p95_s") or 0.0))
                elif now > give_up_at:
                    self._finish(job, _error(job.cancel_code or "timeout",
                                             (job.cancel_message or job.finish_reason or "")
                                             + " (the recording stops at the next step)"))
        reply = dict(job.reply or _error("capture-failed", "the capture ended without a result"))
        reply["_sent"] = job.reply_sent
        return reply

    def cancel(self, code: str = "cancelled", message: str = "the capture was cancelled") -> bool:
        with self.captures._lock:
            job = self.job
            if job is None:
                return False
            if job.cancel_code is None:
                job.cancel_code, job.cancel_message = code, message
            if job.state == "waiting":  # nothing started on the training thread yet
                self._finish_locked(job, _error(code, message))
            elif job.state in ("warmup", "recording"):
                job.state = "cancelling"
        return True

    def _finish_locked(self, job: MemoryJob, reply: dict[str, Any]) -> None:
        if not job.done.is_set():
            job.reply = reply
            job.done.set()
        # A profiler still on stops at the training thread's next step, which then lets go.
        if self.job is job and not (job.running and job.state != "analysing"):
            self.job = None
            if self.telemetry.on_step == self._on_step:
                self.telemetry.on_step = None

    def _finish(self, job: MemoryJob, reply: dict[str, Any]) -> None:
        with self.captures._lock:
            self._finish_locked(job, reply)

    # --- training thread (the optimizer step hook) -----------------------------------------------

    def _on_step(self, now: float) -> None:
        job = self.job
        if job is None:
            return
        t0 = time.perf_counter()
        try:
            if job.cancel_code is not None or job.done.is_set():
                self._stop_instruments(job)
                self._finish(job, _error(job.cancel_code or "cancelled",
                                         job.cancel_message or "the capture was given up"))
            elif job.state == "waiting":
                self._start(job, now)
            elif job.state in ("warmup", "recording"):
                job.marks.append(time.time_ns())
                job.perf.append(now)
                job.state = "recording"
                steps = job.params["steps"]
                if job.recorded >= 1 and job.finish_reason is None:
                    if now - job.perf[1] >= MAX_RECORD_S and job.recorded < steps:
                        job.finish_reason = f"the recording reached its {MAX_RECORD_S:g} s limit"
                    elif job.profiler is not None and job.usual_step_s:
                        # Against the job's p95 step: a busy machine's spread is no slowdown.
                        slower = (now - job.perf[-2]) / job.usual_step_s
                        if slower > MAX_TRACER_SLOWDOWN and job.recorded < steps:
                            job.finish_reason = (f"recording made the step {slower:.0f}x "
                                                 "slower (many operators a step)")
                if job.recorded >= steps or (job.finish_reason and job.recorded >= 1):
                    if job.recorded < steps:
                        job.cut.append(f"{steps - job.recorded} of {steps} steps not "
                                       f"recorded: {job.finish_reason}")
                    self._hand_off(job)
        except Exception as exc:
            self.telemetry.record_error(exc)
            try:
                self._stop_instruments(job)
            except Exception:
                pass
            self._finish(job, _error("capture-failed", f"memory capture failed: {exc}"[:300]))
        finally:
            job.blocked_s += time.perf_counter() - t0

    def _start(self, job: MemoryJob, now: float) -> None:
        import torch

        optimizer = self.telemetry.leader()
        device = param_device(optimizer) or "cpu"
        with self.captures._lock:
            if job.cancel_code is not None or self.job is not job:
                return
            job.first_step = self.telemetry.steps
            if device.startswith("cuda") and torch.cuda.is_initialized():
                index = int(device.partition(":")[2] or torch.cuda.current_device())
                job.device, job.index = f"cuda:{index}", index
                job.our_history = not torch._C._cuda_isHistoryEnabled()
                if job.our_history:
                    torch.cuda.memory._record_memory_history(
                        enabled="all", context="alloc", stacks="python",
                        max_entries=HISTORY_ENTRIES)
                else:
                    job.notes.append("the job records the allocator's history itself: read "
                                     "it, and left it on")
                job.baseline = torch.cuda.memory_allocated(index)
                job.reserved_start = torch.cuda.memory_reserved(index)
            else:
                from torch.profiler import ProfilerActivity, profile

                job.device = "cpu"
                job.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
                # The profiler's start/stop lines and c10's CPUAllocator warning (a block
                # allocated before the capture, freed during it) stay out of the job's stderr.
                quiet.begin()
                job.quiet = True
                job.profiler.start()
                job.mode = site_marks(job.sites)
                enter(job.mode)
            job.train_thread = threading.get_ident()
            job.marks.append(time.time_ns())
            job.perf.append(now)
            job.state = "warmup"

    def _stop_instruments(self, job: MemoryJob, at_exit: bool = False) -> None:
        """Turn off what is on. The mode and the profiler only on the training thread (or at
        exit): elsewhere the mode only stops marking, and the next step boundary ends both."""
        on_thread = at_exit or threading.get_ident() == job.train_thread
        mode = job.mode
        if mode is not None:
            mode.active = False
            if on_thread and leave(mode):
                job.mode = None
        if on_thread and job.mode is None:
            prof, job.profiler = job.profiler, None
            if prof is not None:
                prof.stop()
            self._unquiet(job)
        if job.our_history:
            job.our_history = False
            import torch

            torch.cuda.memory._record_memory_history(enabled=None)

    @staticmethod
    def _unquiet(job: MemoryJob) -> None:
        if job.quiet:
            job.quiet = False
            quiet.end()

    def _stop_quietly(self, job: MemoryJob, at_exit: bool = False) -> None:
        try:
            self._stop_instruments(job, at_exit)
        except Exception as exc:
            self.telemetry.record_error(exc)

    def _hand_off(self, job: MemoryJob) -> None:
        """Stop the profiler here (it was started on this thread), take the model's storages
        while the optimizer's state is whole, and read everything on another thread."""
        if job.mode is not None:
            if not leave(job.mode):
                job.mode.active = False
                job.cut.append("another dispatch mode sat above the capture's at a step "
                               "boundary: the recording ran on to the next one")
                return  # left at the next step boundary (and the profiler stopped then)
            job.mode = None
        prof = job.profiler
        job.profiler = None
        if prof is not None:
            prof.stop()
        self._unquiet(job)
        job.storages = model_storages(self.telemetry.leader(), job.device)
        job.state = "analysing"
        if self.telemetry.on_step == self._on_step:
            self.telemetry.on_step = None
        threading.Thread(target=self._analyse, args=(job, prof), name="gputop-memory",
                         daemon=True).start()

    # --- analysis thread -------------------------------------------------------------------------

    def _analyse(self, job: MemoryJob, prof: Any) -> None:
        started = time.perf_counter()
        try:
            try:
                report = self._report(job, prof)
            finally:
                self._stop_quietly(job)
            report["analysis_s"] = round(time.perf_counter() - started, 6)
            path = write_report(job.directory, report, "memory")
        except OSError as exc:
            self._finish(job, _error("export-failed", f"cannot write the memory report to "
                                     f"{job.directory}: {exc.strerror or exc}"))
            return
        except Exception as exc:
            self.telemetry.record_error(exc)
            self._finish(job, _error("capture-failed", f"memory analysis failed: "
                                     f"{type(exc).__name__}: {exc}"[:300]))
            return
        self.last, self.last_path = report, str(path)
        top = report["growth"][0] if report["growth"] else None
        self._finish(job, {
            "ok": True, "kind": "memory", "report": str(path),
            "bytes": path.stat().st_size, "device": job.device, "source": report["source"],
            "steps": job.params["steps"], "recorded_steps": job.recorded,
            "first_recorded_step": None if job.first_step is None else job.first_step + 2,
            "growth_bytes_per_step": sum(x["bytes_per_step"] for x in report["growth"]),
            "top_growth": None if top is None else f"{top['file']}:{top['line']}",
            "blocked_s": round(job.blocked_s, 6), "analysis_s": report["analysis_s"],
            "window_end_wall": round(job.marks[-1] / 1e9, 6),
            "started_wall": round(job.marks[0] / 1e9, 6),
            "notes": job.notes[:16], "cut": job.cut[:16],
        })

    def _report(self, job: MemoryJob, prof: Any) -> dict[str, Any]:
        import torch

        sites = job.sites
        start, end = job.marks[0], job.marks[-1]
        report = header("capture", job.device, self.started_at)
        deltas: list[tuple[int, int]] = []
        if job.index is not None:
            snapshot = torch.cuda.memory._snapshot()
            traces = snapshot.get("device_traces") or []
            trace = traces[job.index] if job.index < len(traces) else []
            read = allocator_events(trace, sites, start, end)
            events, deltas = read.events, read.reserved_deltas
            if read.entries >= HISTORY_ENTRIES and (read.first_entry_ns or 0) > start:
                job.cut.append(f"the allocator's history holds {HISTORY_ENTRIES:,} events: the "
                               f"window's first {(read.first_entry_ns - start) / 1e9:.2f} s of "
                               "allocations are not in it")
            report["source"] = "allocator-history"
            self._stop_quietly(job)  # the history is read: off at once
            report["allocator"] = cuda_allocator(torch, job.index, snapshot)
            del snapshot, traces, trace
        else:
            from torch._C._profiler import _EventType

            walked = profiler_events(prof.profiler.kineto_results, "cpu", ANALYSIS_BUDGET_S,
                                     _EventType, PREFIX)
            events = walked.events
            if not walked.complete:
                job.cut.append(f"the profiler's events were read for {ANALYSIS_BUDGET_S:g} s "
                               "and the rest left out (many operators a step)")
            report["source"] = "profiler"
            report["allocator"] = {"caching": False}
            job.notes.append("the CPU allocator does not cache: what is freed goes back to the "
                             "C library at once (reserved = allocated); memory allocated before "
                             "the capture is seen only as the model's own tensors")
        lines, newest = growth(events, job.marks)
        composition = peak(events, job.marks, job.storages, job.baseline)
        keepers: dict[int, str] = {}
        if newest:
            from gputop.agent.memory.keepers import find_keepers

            keepers, why_not = find_keepers(torch, newest)
            if why_not:
                job.notes.append(why_not)
        report.update({
            "steps": job.recorded,
            "first_step": None if job.first_step is None else job.first_step + 2,
            "window_s": round((end - job.marks[1]) / 1e9, 6) if len(job.marks) > 1 else None,
            "step_times_s": [round(b - a, 6) for a, b in zip(job.perf[1:], job.perf[2:])],
            "usual_step_s": job.usual_step_s,
            "events": len(events),
            "growth": [_line(sites, x, keepers.get(x["site"])) for x in lines],
            "peak": None,
            "model": job.storages.totals(),
            "process": process_memory(),
            "notes": job.notes[:16], "cut": job.cut[:16],
        })
        if composition is not None:
            composition["activation_lines"] = [
                {**_where(sites, x["site"]), "bytes": x["bytes"]}
                for x in composition["activation_lines"]]
            if job.reserved_start is not None:
                composition["reserved"] = reserved_at(deltas, job.reserved_start,
                                                      composition["time_ns"])
            composition.pop("time_ns", None)
            report["peak"] = composition
        return report

    # --- exit and fork ---------------------------------------------------------------------------

    def abandon(self) -> None:
        """The process exits (or the agent shuts down): stop the profiler (torch 2.13 can crash
        at exit with one running) and the allocator's history, and tell whoever waits."""
        job = self.job
        if job is None:
            return
        self._stop_quietly(job, at_exit=True)
        self._finish(job, _error("exited", "the process exited before the memory capture "
                                 "finished"))
        job.reply_sent.wait(3.0)

    def leave_after_fork(self) -> None:
        """In a forked child: its thread inherited the dispatch mode of a capture recording in
        the parent; leave it there (the child's profiler state is not ours to stop)."""
        job = self.job
        if job is not None and job.mode is not None:
            leave_after_fork(job.mode)


def _where(sites: Sites, site: int) -> dict[str, Any]:
    if site < 0:
        return {"file": None, "line": None, "function": None, "code": None}
    s = sites.sites[site]
    return {"file": s.file, "line": s.line, "function": s.function, "code": sites.code(site)}


def _line(sites: Sites, found: dict[str, Any], keeper: str | None) -> dict[str, Any]:
    return {**_where(sites, found["site"]), "bytes": found["bytes"],
            "bytes_per_step": found["bytes_per_step"], "count": found["count"],
            "alive_per_step": found["alive_per_step"], "steady": found["steady"],
            "kept_by": keeper}


def _error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "message": message}

