"""Profiler captures inside the training process.

A step-aligned capture is asked for on the server thread but started, stepped and stopped on the
training thread, from the optimizer step post-hook: a profiler started from another thread does
not see the training thread's ops. The Chrome trace is written by a short-lived export thread,
so the training thread only pays for starting and stopping the profiler. Where nothing steps an
optimizer, a time-window capture profiles all threads from the server side (when torch can).

Every capture is bounded (README "What a capture costs"): the detail that grows without bound
is off unless asked for (the Python tracer ``with_stack``, shapes, memory events); the recording
stops at the first step boundary after ``MAX_RECORD_S``; the written trace holds at most
``JSON_PER_STEP`` bytes of JSON per recorded step (``trace_budget`` cuts the rest, shortest
events first, and the trace and the reply say what went); and a job whose steps are slower than
the capture's deadline, or that makes none, gets a time window of all threads instead, with a
note. What was cut or changed is listed in the reply's ``"cut"`` and ``"notes"``.

torch is only imported here lazily, and only when the program has imported it already.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gputop.agent import quiet as stderr_filter
from gputop.agent.capture_request import parse_capture_request
from gputop.agent.capture_state import CaptureJob
from gputop.agent.sigterm import SigtermExport
from gputop.agent.telemetry import StepTelemetry
from gputop.agent.trace_export import (
    CaptureError,
    Written,
    error_reply,
    no_window_reason,
    prepare_capture_dir,
    profile_all_threads_supported,
    profiler_activities,
    trace_only,
    write_trace,
)
from gputop.core.protocol import MAX_STEPS

MIN_FIRST_STEP_WAIT_S = 10.0  # how long "no optimizer step" waits, at least (unless timeout)
MAX_RECORD_S = 30.0  # recording stops at the first step boundary after this (one step at least)
FALLBACK_WINDOW_S = 5.0  # the time window recorded for a job slower than the deadline
# With the Python tracer (with_stack), a recorded step this many times slower than the job's
# usual step ends the recording: the rest would cost as much again, and so would the
# profiler's stop, which processes every Python call recorded.
MAX_TRACER_SLOWDOWN = 3.0
class CaptureController(SigtermExport):
    """Runs at most one capture at a time; the second request is told ``busy``."""

    def __init__(self, telemetry: StepTelemetry, hooks_ready: Callable[[], str | None]) -> None:
        self.telemetry = telemetry
        # Returns None when the step hook is in place, else why captures by steps cannot work.
        self._hooks_ready = hooks_ready
        self._lock = threading.Lock()
        self.job: CaptureJob | None = None
        self.last: dict[str, Any] | None = None
        self._sigterm_set = False
        self._finishing = False  # finish_early is exporting a partial trace
        self._terminated = False  # a SIGTERM came while it did
        # Why another kind of capture (a memory capture) holds the job now, or None: one
        # capture at a time. Checked under ``_lock``, which that one takes to start too.
        self.busy_elsewhere: Callable[[], str | None] = lambda: None

    # --- server thread -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        job = self.job
        state = job.progress() if job is not None else {"state": "idle"}
        if self.last is not None:
            state["last"] = self.last
        return state

    def capture(self, message: dict[str, Any], client_gone: Callable[[], bool]) -> dict[str, Any]:
        """Serve one ``capture`` request, blocking this (connection) thread until it is done."""
        try:
            params = parse_capture_request(message)
            if params["mode"] == "steps":
                why_not = self._hooks_ready()
                if why_not is not None:
                    raise CaptureError("unsupported", why_not)
            elif not profile_all_threads_supported():
                raise CaptureError("unsupported", no_window_reason())
            if self.job is not None:
                raise CaptureError("busy", self._busy_message())
            directory = prepare_capture_dir(params["out"])
            job = CaptureJob(params, directory)
            job.steps_at_request = self.telemetry.steps
            job.usual_step_s = self.telemetry.status().get("step_time_p50_s")
            start = params["start_step"]
            if start is not None and job.steps_at_request >= start:
                raise CaptureError(
                    "late", f"step {start} has passed (this process is at step "
                    f"{job.steps_at_request}); ask for a later start_step")
            with self._lock:
                if self.job is not None:
                    raise CaptureError("busy", self._busy_message())
                elsewhere = self.busy_elsewhere()
                if elsewhere is not None:
                    raise CaptureError("busy", elsewhere)
                self.job = job
            if params["mode"] == "steps":
                slow = self._slower_than_deadline(params)
                if slow is not None and profile_all_threads_supported():
                    self._to_window(job, slow, params["timeout"])
                    return self._time_window(job, client_gone)
                self.telemetry.on_step = self._on_step
                return self._wait_for_steps(job, client_gone)
            return self._time_window(job, client_gone)
        except CaptureError as exc:
            return {"ok": False, "error": exc.code, "message": str(exc)}

    def cancel(self, code: str = "cancelled", message: str = "the capture was cancelled") -> bool:
        with self._lock:
            job = self.job
            if job is None:
                return False
            if job.cancel_code is None:
                job.cancel_code, job.cancel_message = code, message
            if job.state == "waiting" and job.params["mode"] == "steps":
                # Nothing started on the training thread yet: finish here and now.
                self._finish_locked(job, error_reply(code, message))
            elif job.state in ("warmup", "recording"):
                job.state = "cancelling"  # the next step stops the profiler
        return True

    def abandon_at_exit(self) -> None:
        """The process is exiting: stop a running profiler and tell whoever waits, with the
        steps recorded so far when there are any (a job whose rank died: the survivors' traces
        still show what they were doing).

        A torch profiler still running at interpreter shutdown can crash the process (seen
        with torch 2.13: SIGSEGV), which would turn a clean exit of the job into a failure.
        """
        self.finish_early("the process exited")

    def finish_early(self, why: str) -> None:
        """Stop now, on the training thread (at exit, or in the SIGTERM handler): export what
        was recorded as a partial trace, or reply ``exited`` when nothing was. Waits briefly
        for the reply to leave, since the process is about to end. A SIGTERM that arrives
        meanwhile is held until then."""
        job = self.job
        if job is None or self._finishing:
            return
        self._finishing = True
        try:
            recorded = job.state == "recording" and job.steps_seen > job.params["warmup"]
            # The Python tracer's recording takes many seconds to write: not at exit, where
            # it would hold the job's end up.
            heavy = job.params["with_stack"]
            prof = job.profiler
            try:
                self._stop_profiler(job)
            except Exception as exc:
                self.telemetry.record_error(exc)
                prof = None
            reply = None
            if recorded and prof is not None and not heavy:
                try:
                    written = write_trace(prof, job.directory, job.budget)
                    job.cut.extend(written.cut)
                    reply = self._success(job, written)
                    done = max(0, job.steps_seen - job.params["warmup"])
                    reply["partial"] = True
                    reply["partial_reason"] = (f"{why} after {done} of {job.params['steps']} "
                                               "recorded steps")
                except Exception as exc:
                    self.telemetry.record_error(exc)
            with self._lock:
                self._finish_locked(job, reply or error_reply(
                    "exited", f"{why} before the capture finished" + (
                        " (a --with-stack recording is not written at exit: it would hold "
                        "the exit up)" if recorded and heavy else "")))
            job.reply_sent.wait(3.0)  # the connection thread writes it to the socket
        finally:
            self._finishing = False
            self._restore_sigterm()
            self._die_if_terminated()

    def _busy_message(self) -> str:
        job = self.job
        if job is None:
            return "a capture is already running"
        return f"a capture is already running ({job.state}, {job.progress()['elapsed_s']:.1f} s)"

    def _first_step_wait(self, timeout: float) -> float:
        p95 = self.telemetry.status().get("step_time_p95_s") or 0.0
        return min(timeout / 2, max(MIN_FIRST_STEP_WAIT_S, 3.0 * p95))

    def _slower_than_deadline(self, params: dict[str, Any]) -> str | None:
        """Why the steps asked for cannot be recorded before the deadline (the job's recent
        steps say so), or None."""
        p95 = self.telemetry.status().get("step_time_p95_s")
        if not p95:
            return None
        # The next step boundary starts the profiler, then warm-up and recorded steps.
        need = (1 + params["warmup"] + params["steps"]) * p95
        if need <= params["timeout"]:
            return None
        return (f"the job's steps take {p95:.3g} s (p95), so {params['warmup']} warm-up and "
                f"{params['steps']} recorded steps need about {need:.0f} s, more than the "
                f"capture's {params['timeout']:g} s deadline")

    def _to_window(self, job: CaptureJob, why: str, time_left: float) -> None:
        """Record a time window of all threads instead of steps, and say so."""
        seconds = max(0.5, min(FALLBACK_WINDOW_S, time_left))
        job.params = {**job.params, "mode": "seconds", "seconds": seconds, "steps": 0,
                      "warmup": 0, "start_step": None}
        job.notes.append(f"{why}: recorded a {seconds:g} s time window of all threads instead "
                         "(whatever each thread ran in it, not whole steps)")

    def _wait_for_steps(self, job: CaptureJob, client_gone: Callable[[], bool]) -> dict[str, Any]:
        timeout = job.params["timeout"]
        first_wait = self._first_step_wait(timeout)
        give_up_at: float | None = None
        while not job.done.wait(0.05):
            now = time.monotonic()
            waited = now - job.requested_at
            if job.cancel_code is not None:
                # A running profiler can only stop at the training thread's next step; do not
                # wait for a step that may never come (a stuck job).
                if give_up_at is None:
                    p95 = self.telemetry.status().get("step_time_p95_s") or 0.0
                    give_up_at = now + max(5.0, 2.0 * p95)
                elif now > give_up_at:
                    return error_reply(
                        job.cancel_code,
                        f"{job.cancel_message} (the profiler stops at the next step)",
                    )
            elif client_gone():
                self.cancel("cancelled", "the client went away")
            elif (job.state == "waiting" and waited > first_wait
                  and self.telemetry.steps == job.steps_at_request
                  and profile_all_threads_supported() and self._claim_for_window(
                      job, f"no optimizer step in {waited:.0f} s (a step slower than that, "
                      "inference, or a stuck job)", timeout - waited)):
                reply = self._time_window(job, client_gone)
                return {**reply, "_sent": job.reply_sent}
            elif (job.state == "waiting" and waited > first_wait
                  and self.telemetry.steps == job.steps_at_request):
                hint = (
                    f"; a time-window capture does not need steps: gputop capture {os.getpid()} "
                    "--seconds 5"
                    if profile_all_threads_supported()
                    else f"; {no_window_reason()}"
                )
                self.cancel(
                    "no-steps",
                    f"no optimizer step in {waited:.0f} s (inference, or a stuck job?){hint}",
                )
            elif waited > timeout and job.finish_reason is None and job.state == "recording" \
                    and job.steps_seen > job.params["warmup"]:
                # Steps are recorded: keep them. The profiler stops at the next step boundary.
                job.finish_reason = f"the capture's {timeout:g} s deadline passed"
                give_up_at = now + max(5.0, 2.0 * (
                    self.telemetry.status().get("step_time_p95_s") or 0.0))
            elif job.finish_reason is not None and give_up_at is not None and now > give_up_at:
                self.cancel("timeout", f"no step boundary came after {job.finish_reason} "
                            "to stop the recording at")
            elif waited > timeout and job.finish_reason is None:
                p = job.progress()
                self.cancel(
                    "timeout",
                    f"only {p['steps_done']} of {p['steps_total']} steps recorded in "
                    f"{timeout:g} s; try fewer --steps or a longer --timeout",
                )
        reply = dict(job.reply or error_reply("capture-failed", "the capture ended without a result"))
        reply["_sent"] = job.reply_sent  # set by the server once the reply is written
        return reply

    def _claim_for_window(self, job: CaptureJob, why: str, time_left: float) -> bool:
        """Turn a step capture that still waits (the training thread has not started the
        profiler) into a time window; False when it no longer waits."""
        with self._lock:
            if job.state != "waiting" or self.job is not job or job.cancel_code is not None:
                return False
            self.telemetry.on_step = None
            self._to_window(job, why, time_left)
            job.state = "recording"
            return True

    def _finish_locked(self, job: CaptureJob, reply: dict[str, Any]) -> None:
        if job.done.is_set():
            return
        job.reply = reply
        if self.job is job:
            self.job = None
            self.telemetry.on_step = None
        self.last = {
            "ok": bool(reply.get("ok")),
            "trace": reply.get("trace"),
            "error": reply.get("error"),
            "finished_at": round(time.time(), 3),
        }
        job.done.set()

    def _finish(self, job: CaptureJob, reply: dict[str, Any]) -> None:
        with self._lock:
            self._finish_locked(job, reply)

    # --- training thread (from the optimizer step post-hook) ---------------------------------

    def _on_step(self, now: float) -> None:
        job = self.job
        if job is None or job.params["mode"] != "steps":
            return
        t0 = time.perf_counter()
        try:
            if job.cancel_code is not None:
                self._stop_profiler(job)
                self._finish(job, error_reply(job.cancel_code, job.cancel_message))
            elif job.state == "waiting":
                start = job.params["start_step"]
                steps = self.telemetry.steps
                if start is not None and steps < start:
                    return  # not yet: the other ranks start at the same step
                if start is not None and steps > start:
                    self._finish(job, error_reply("late", f"step {start} passed before the capture "
                                                     f"could start (now at step {steps})"))
                    return
                job.first_step = steps
                job.train_thread = threading.get_ident()
                self._start_profiler(job, now)
            elif job.state in ("warmup", "recording"):
                job.marks.append(now)
                job.steps_seen += 1
                warmup, steps = job.params["warmup"], job.params["steps"]
                recorded = job.steps_seen - warmup
                if 0 < recorded < steps and job.finish_reason is None:
                    if now - job.marks[warmup] >= MAX_RECORD_S:
                        job.finish_reason = (f"the recording reached its {MAX_RECORD_S:g} s "
                                             "limit")
                    elif job.params["with_stack"] and job.usual_step_s:
                        slower = (now - job.marks[-2]) / job.usual_step_s
                        if slower > MAX_TRACER_SLOWDOWN:
                            job.finish_reason = (f"the Python tracer made the step {slower:.0f}x "
                                                 "slower")
                if job.finish_reason is not None and 0 < recorded < steps:
                    job.cut.append(f"{steps - recorded} of {steps} steps not recorded: "
                                   f"{job.finish_reason}")
                    self._hand_off(job)  # stops the profiler here: the steps so far are kept
                    return
                job.profiler.step()  # the filter is on: a schedule's start/stop lines dropped
                if job.steps_seen >= warmup:
                    job.state = "recording"
                if job.trace_ready:
                    self._hand_off(job)
        except Exception as exc:
            self.telemetry.record_error(exc)
            try:
                self._stop_profiler(job)
            except Exception:
                pass
            self._finish(job, error_reply("capture-failed", f"profiler failed: {exc}"[:300]))
        finally:
            job.blocked_s += time.perf_counter() - t0

    def _start_profiler(self, job: CaptureJob, now: float) -> None:
        from torch.profiler import ProfilerAction, profile

        warmup, steps = job.params["warmup"], job.params["steps"]

        def schedule(step: int) -> ProfilerAction:
            # Our own schedule: torch's builder warns about warmup=0 in the user's stderr.
            if step < warmup:
                return ProfilerAction.WARMUP
            if step < warmup + steps - 1:
                return ProfilerAction.RECORD
            if step == warmup + steps - 1:
                return ProfilerAction.RECORD_AND_SAVE
            return ProfilerAction.NONE

        def trace_ready(_prof: Any) -> None:
            job.trace_ready = True

        with self._lock:
            if job.cancel_code is not None or self.job is not job or job.state != "waiting":
                return  # cancelled, or turned into a time window meanwhile
            job.profiler = profile(
                activities=profiler_activities(),
                schedule=schedule,
                on_trace_ready=trace_ready,
                record_shapes=job.params["record_shapes"],
                with_stack=job.params["with_stack"],
                profile_memory=job.params["profile_memory"],
                **trace_only(job.params["with_stack"]),
            )
            stderr_filter.begin()  # the profiler's own lines stay out of the job's stderr
            job.quiet = True
            job.profiler.start()
            job.marks.append(now)
            job.state = "warmup" if warmup else "recording"
            self._catch_sigterm()

    def _stop_profiler(self, job: CaptureJob) -> None:
        self._restore_sigterm()
        prof, job.profiler = job.profiler, None
        try:
            if prof is not None:
                prof.stop()
        finally:
            self._unquiet(job)

    @staticmethod
    def _unquiet(job: CaptureJob) -> None:
        if job.quiet:
            job.quiet = False
            stderr_filter.end()

    def _hand_off(self, job: CaptureJob) -> None:
        """Stop on the training thread, export on another one."""
        self._restore_sigterm()
        prof = job.profiler
        job.profiler = None
        try:
            prof.stop()
        finally:
            self._unquiet(job)
        job.state = "exporting"
        self.telemetry.on_step = None
        thread = threading.Thread(
            target=self._export, args=(job, prof), name="gputop-export", daemon=True
        )
        thread.start()

    # --- export thread -------------------------------------------------------------------------

    def _export(self, job: CaptureJob, prof: Any) -> None:
        try:
            written = write_trace(prof, job.directory, job.budget)
            job.cut.extend(written.cut)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            self._finish(
                job, error_reply("export-failed", f"cannot write the trace to {job.directory}: {reason}")
            )
            return
        except Exception as exc:
            self._finish(job, error_reply("export-failed", f"trace export failed: {exc}"[:300]))
            return
        self._finish(job, self._success(job, written))

    def _success(self, job: CaptureJob, written: Written) -> dict[str, Any]:
        path = written.path
        warmup = job.params["warmup"]
        marks = job.marks[warmup:] if job.params["mode"] == "steps" else job.marks
        summary: dict[str, Any] = {"duration_s": None, "step_time_mean_s": None}
        if len(marks) >= 2:
            summary["duration_s"] = round(marks[-1] - marks[0], 6)
        if job.params["mode"] == "steps" and len(marks) >= 2:
            summary["step_time_mean_s"] = round((marks[-1] - marks[0]) / (len(marks) - 1), 6)
            waits = [s for s in self.telemetry.recent_steps(marks[0]) if s[0] <= marks[-1]]
            total = sum(s[1] for s in waits)
            summary["dataloader_wait_share"] = (
                round(sum(s[2] for s in waits) / total, 4) if total else None
            )
        summary["blocked_s"] = round(job.blocked_s, 6)
        recorded = max(0, len(marks) - 1) if job.params["mode"] == "steps" else 0
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        return {
            "ok": True,
            "trace": str(path),
            "bytes": size,
            # Absolute step numbers (this agent's count): ranks of one job started at one
            # start_step record the same iterations.
            "start_step": job.first_step,
            # The profiler starts after step start_step: the warm-up steps follow, then the
            # recorded ones.
            "first_recorded_step": (
                job.first_step + warmup + 1 if job.first_step is not None else None),
            "mode": job.params["mode"],
            "steps": job.params["steps"],
            "warmup": job.params["warmup"],
            "seconds": job.params["seconds"],
            "summary": summary,
            "profiler_started_wall": (round(job.marks[0] + job.wall_offset, 6)
                                      if job.marks else None),
            # For the monitor's Python stack samples: the wall-clock times of the recorded
            # step boundaries (or of the window's start and end) and the training thread.
            "walls": [round(m + job.wall_offset, 6) for m in marks][:MAX_STEPS + 1],
            "train_thread": job.train_thread,
            "recorded_steps": recorded,
            "with_stack": job.params["with_stack"],
            "budget_bytes": job.budget,
            "profiler_json_bytes": written.json_bytes,
            "cut": job.cut[:16],
            "notes": job.notes[:16],
        }

    # --- time window (server side, all threads) ----------------------------------------------

    def _time_window(self, job: CaptureJob, client_gone: Callable[[], bool]) -> dict[str, Any]:
        from torch.profiler import _ExperimentalConfig, profile

        seconds = job.params["seconds"]
        try:
            prof = profile(
                activities=profiler_activities(),
                record_shapes=job.params["record_shapes"],
                with_stack=job.params["with_stack"],
                profile_memory=job.params["profile_memory"],
                experimental_config=_ExperimentalConfig(profile_all_threads=True),
            )
            with stderr_filter.quiet():
                prof.start()
        except Exception as exc:
            self._finish(job, error_reply("capture-failed", f"profiler failed to start: {exc}"[:300]))
            return job.reply or {}
        job.state = "recording"
        job.train_thread = self.telemetry.step_thread
        job.marks.append(time.perf_counter())
        end = time.monotonic() + seconds
        while time.monotonic() < end and job.cancel_code is None:
            if client_gone():
                job.cancel_code, job.cancel_message = "cancelled", "the client went away"
                break
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        try:
            with stderr_filter.quiet():
                prof.stop()
        except Exception as exc:
            self._finish(job, error_reply("capture-failed", f"profiler failed to stop: {exc}"[:300]))
            return job.reply or {}
        job.marks.append(time.perf_counter())
        if job.cancel_code is not None:
            self._finish(job, error_reply(job.cancel_code, job.cancel_message))
        else:
            job.state = "exporting"
            self._export(job, prof)
        return job.reply or {}
