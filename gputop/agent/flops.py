"""One training step's FLOPs, counted inside the training process with PyTorch's own counter.

``torch.utils.flop_counter.FlopCounterMode`` is a ``TorchDispatchMode``: every aten operator the
thread runs while it is on the dispatch-mode stack passes through Python, and the operators in
its registry (matmuls, convolutions, attention, ...) add the FLOPs their shapes imply. The mode
stack is per thread (the autograd engine carries it into its backward threads), so the count
must be entered and left on the training thread: the agent enters it in its optimizer-step hook
and leaves it in the next one, so it covers exactly one optimizer step (forward, backward, the
optimizer, the DataLoader's fetch), whatever the loop looks like.

Once after warm-up (the ``AUTO_AFTER_STEPS``-th step, once per process; ``GPUTOP_FLOP_COUNT=0``
turns that off) and again on request (``{"cmd": "flops"}``, the monitor's ``m``). Only one step
is counted; the count refuses to start while a profiler capture runs, and bounds itself:

* its cost is that step running every operator through Python (see benchmarks/bench_agent.py);
* a step that runs past ``max(MIN_LIMIT_S, LIMIT_STEPS x the typical step)`` stops counting
  (every later operator passes straight through), and the mode is left at the next safe point on
  the training thread: the next step, module forward or DataLoader batch, or the process's exit;
* an error in the counter stops the count and is reported; nothing is raised into the loop.

Besides the total it reports FLOPs per precision (the dtype of each counted operator's input;
fp32 on CUDA becomes tf32 where PyTorch lets cuBLAS or cuDNN use TF32) and the samples of the
step (the leading dimension of the batches the DataLoader handed out meanwhile).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gputop.agent.telemetry import StepTelemetry

AUTO_AFTER_STEPS = 10  # the automatic count covers the step after this one
MIN_LIMIT_S = 30.0
LIMIT_STEPS = 10.0  # a counted step may take this many typical steps (at least MIN_LIMIT_S)
DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 3600.0
ENV = "GPUTOP_FLOP_COUNT"

_auto_counted_pid: int | None = None  # the process whose automatic count has started

_DTYPES = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
           "int8": "int8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
           "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}


def _first_tensor(value: Any, depth: int = 0) -> Any:
    """The first tensor in a batch or an operator's arguments (lists, tuples, dicts)."""
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        return value
    if depth >= 3:
        return None
    items = value.values() if isinstance(value, dict) else value
    if isinstance(items, (list, tuple)) or isinstance(value, dict):
        for item in list(items)[:16]:
            found = _first_tensor(item, depth + 1)
            if found is not None:
                return found
    return None


def _tf32_switches() -> tuple[bool, bool]:
    """(matmuls, convolutions) may use TF32 for fp32 on CUDA, as PyTorch is set now."""
    import torch

    def allowed(backend: Any, legacy: Callable[[], bool]) -> bool:
        precision = getattr(backend, "fp32_precision", "none")
        if precision == "tf32":
            return True
        if precision == "ieee":
            return False
        return bool(legacy())

    try:
        return (allowed(torch.backends.cuda.matmul, lambda: torch.backends.cuda.matmul.allow_tf32),
                allowed(torch.backends.cudnn, lambda: torch.backends.cudnn.allow_tf32))
    except Exception:
        return False, False


class _NoModuleTracker:
    """FlopCounterMode's per-module breakdown needs global module hooks; the total does not."""

    parents: set[str] = {"Global"}

    def __enter__(self) -> _NoModuleTracker:
        return self

    def __exit__(self, *args: Any) -> None:
        return None


# Calling torch.compile'd code under a TorchDispatchMode (FlopCounterMode is one) turns dynamo
# off for the rest of the process in torch 2.13: compiled functions, new and old, then run eager
# (tests/test_compile_watch.py). A compiled job is never counted.
COMPILED = ("the job uses torch.compile: counting FLOPs under a dispatch mode would stop its "
            "compiled code (torch runs it eager afterwards), so it is not counted")


def uses_torch_compile() -> bool:
    """Whether dynamo has compiled a frame in this process (its counters say so)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        frames = utils.counters.get("frames") if utils is not None else None
        return bool(frames and frames.get("total", 0) > 0)
    except Exception:
        return True  # unsure: leave the job alone


def _counter(deadline: float, on_stop: Callable[[], None]) -> Any:
    """A FlopCounterMode that counts per precision, stops at ``deadline`` (then calls
    ``on_stop``) and never raises."""
    from torch.utils.flop_counter import FlopCounterMode

    matmul_tf32, conv_tf32 = _tf32_switches()

    class StepFlopCounter(FlopCounterMode):
        def __init__(self) -> None:
            super().__init__(display=False)
            self.mod_tracker = _NoModuleTracker()
            self.by_precision: dict[str, int] = {}
            self.devices: set[str] = set()
            self.stopped: str | None = None  # why counting stopped early

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            if self.stopped is not None:
                return out
            formula = self.flop_registry.get(func_packet)
            if formula is None:
                return out
            try:
                if time.perf_counter() > deadline:
                    self.stopped = "the step ran past the count's time limit"
                    on_stop()
                    return out
                flops = int(formula(*args, **kwargs, out_val=out))
                tensor = _first_tensor(args)
                key = "unknown"
                if tensor is not None:
                    name = str(tensor.dtype).removeprefix("torch.")
                    key = _DTYPES.get(name, name)
                    device = tensor.device.type
                    self.devices.add(device)
                    if key == "fp32" and device == "cuda":
                        conv = "conv" in getattr(func_packet, "__name__", "")
                        if conv_tf32 if conv else matmul_tf32:
                            key = "tf32"
                self.by_precision[key] = self.by_precision.get(key, 0) + flops
            except Exception as exc:
                self.stopped = f"counting failed: {type(exc).__name__}: {exc}"[:200]
                on_stop()
            return out

    return StepFlopCounter()


def _current_mode() -> Any:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


class FlopCount:
    """At most one count at a time: armed -> counting -> idle, with the last result kept."""

    def __init__(self, telemetry: StepTelemetry, hooks_ready: Callable[[], str | None],
                 capture_busy: Callable[[], bool]) -> None:
        self.telemetry = telemetry
        self._hooks_ready = hooks_ready  # None when the step hook is in place, else why not
        self._capture_busy = capture_busy
        self._lock = threading.Lock()
        self.state = "idle"  # idle | armed | counting
        self.trigger: str | None = None  # auto | request
        self.start_after = 0  # the count starts at the first boundary at or after this step
        self.last: dict[str, Any] | None = None  # the last finished count (or failure)
        self.done = threading.Event()
        self._counter: Any = None
        self._thread: int | None = None
        self._t0 = 0.0
        self._start_step = 0
        self._typical: float | None = None
        self._limit = MIN_LIMIT_S
        self._expired = False
        self._samples: int | None = None
        self._undo: list[Callable[[], None]] = []

    # --- arming (any thread) -------------------------------------------------------------------

    def arm_auto(self) -> None:
        """After warm-up, once per process (unless GPUTOP_FLOP_COUNT=0)."""
        global _auto_counted_pid
        if os.environ.get(ENV, "").strip() == "0" or _auto_counted_pid == os.getpid():
            return
        if self.arm("auto", AUTO_AFTER_STEPS):
            _auto_counted_pid = os.getpid()

    def arm(self, trigger: str, after_step: int = 0) -> bool:
        """Count the next step (after ``after_step``); False when one is already pending."""
        with self._lock:
            if self.state != "idle":
                return False
            self.state, self.trigger = "armed", trigger
            self.start_after = after_step
            self.done = threading.Event()
            self.telemetry.on_boundary = self.boundary
        return True

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        if self.state != "idle":
            out["trigger"] = self.trigger
        if self.last is not None:
            out["last"] = self.last
        return out

    # --- the request (server thread) -----------------------------------------------------------

    def request(self, message: dict[str, Any], client_gone: Callable[[], bool]) -> dict[str, Any]:
        """Serve ``{"cmd": "flops"[, "timeout": S]}``: count the next step and reply with it."""
        extra = sorted(repr(str(k)[:40]) for k in message if k not in ("cmd", "timeout"))
        if extra:
            return _error("bad-request", f"unknown field(s) for flops: {', '.join(extra)}")
        timeout = message.get("timeout", DEFAULT_TIMEOUT_S)
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not 0.1 <= timeout <= MAX_TIMEOUT_S):
            return _error("bad-request", f"timeout must be a number of seconds, 0.1 to "
                                         f"{MAX_TIMEOUT_S:g}")
        why_not = self._hooks_ready()
        if why_not is not None:
            return _error("unsupported", why_not)
        try:
            import torch.utils.flop_counter  # noqa: F401  (the program has imported torch)
        except Exception as exc:
            return _error("unsupported", f"this torch has no FlopCounterMode: {exc}"[:300])
        if self._capture_busy():
            return _error("busy", "a profiler capture is running; count FLOPs after it")
        if uses_torch_compile():
            return _error("unsupported", COMPILED)
        if not self.arm("request", self.telemetry.steps):
            with self._lock:
                if self.trigger == "request":
                    return _error("busy", f"a FLOP count is already {self.state}")
                # The automatic count is pending: it answers this request, at the next step.
                self.trigger = "request"
                self.start_after = min(self.start_after, self.telemetry.steps)
        done, asked = self.done, time.monotonic()
        while not done.wait(0.05):
            waited = time.monotonic() - asked
            if client_gone() or waited > timeout:
                if self.disarm():
                    return _error("no-steps" if self.telemetry.steps == 0 or waited > timeout
                                  else "cancelled",
                                  f"no optimizer step in {waited:.0f} s (inference, or a stuck "
                                  "job?)" if waited > timeout else "the client went away")
                counter = self._counter
                if counter is not None and counter.stopped is None:
                    counter.stopped = "the request timed out or its client went away"
                self._stop_soon()  # counting: it stops now, and leaves at a safe point
                if waited > timeout + 5.0:
                    return _error("timeout", f"the counted step did not end in {timeout:g} s; "
                                             "counting stopped")
        last = dict(self.last or {})
        if not last.get("ok"):
            return _error(last.get("error") or "count-failed",
                          last.get("message") or "the count ended without a result")
        return {"ok": True, **{k: v for k, v in last.items() if k != "ok"}}

    def disarm(self) -> bool:
        """Withdraw a count that has not started; False once it is counting."""
        with self._lock:
            if self.state != "armed":
                return False
            self.state = "idle"
            self.telemetry.on_boundary = None
            self.done.set()
        return True

    # --- training thread -------------------------------------------------------------------------

    def boundary(self, now: float) -> None:
        """An optimizer step ended (the leader's, from the agent's step hook)."""
        try:
            if self.state == "armed":
                if self.telemetry.steps >= self.start_after and not self._capture_busy():
                    if uses_torch_compile():
                        self._done({"ok": False, "error": "unsupported", "message": COMPILED})
                        return
                    self._start(now)
            elif self.state == "counting":
                self._finish(now)
        except Exception as exc:
            self._fail("count-failed", f"{type(exc).__name__}: {exc}"[:300])

    def _start(self, now: float) -> None:
        ring = [s[1] for s in self.telemetry.recent_steps(0.0)]
        self._typical = sorted(ring)[len(ring) // 2] if ring else None
        self._limit = max(MIN_LIMIT_S, LIMIT_STEPS * (self._typical or 0.0))
        self._expired = False
        self._samples = None
        counter = _counter(time.perf_counter() + self._limit, self._stop_soon)
        with self._lock:
            if self.state != "armed":
                return
            counter.__enter__()
            self._counter, self._thread = counter, threading.get_ident()
            self._t0, self._start_step = now, self.telemetry.steps
            self.state = "counting"
        ledger = self.telemetry.ledger
        if ledger is not None:
            ledger.counting = True
        self._watch_batches()

    def _finish(self, now: float) -> None:
        counter = self._counter
        if not self._leave(counter):
            self._stop_soon()  # not here (another thread, a mode above ours): at a safe point
            return
        counted_s = now - self._t0
        total = sum(counter.by_precision.values())
        if counter.stopped is not None:
            self._done({"ok": False, "error": "incomplete", "message": counter.stopped})
            return
        if self.telemetry.steps != self._start_step + 1:
            self._done({"ok": False, "error": "incomplete",
                        "message": "the count did not cover exactly one step"})
            return
        by = dict(sorted(counter.by_precision.items(), key=lambda kv: -kv[1]))
        main = next(iter(by), None)
        self._done({
            "ok": True,
            "flops_per_step": total,
            "by_precision": by,
            "precision": main,
            "precision_share": round(by[main] / total, 4) if main and total else None,
            "devices": sorted(counter.devices),
            "samples_per_step": self._samples,
            "step": self._start_step + 1,
            "counted_step_s": round(counted_s, 6),
            "typical_step_s": None if self._typical is None else round(self._typical, 6),
            # What counting cost the job: the counted step beyond a typical one.
            "cost_s": None if self._typical is None
            else round(max(0.0, counted_s - self._typical), 6),
            "trigger": self.trigger,
            "finished_at": round(time.time(), 3),
        })

    def _leave(self, counter: Any) -> bool:
        """Leave the dispatch mode: only on its thread, and only when it is on top."""
        if counter is None:
            return True
        if threading.get_ident() != self._thread or _current_mode() is not counter.mode:
            return False
        counter.__exit__(None, None, None)
        self._counter = None
        return True

    def _done(self, result: dict[str, Any]) -> None:
        with self._lock:
            undos, self._undo = self._undo, []
        for undo in reversed(undos):
            try:
                undo()
            except Exception:
                pass
        ledger = self.telemetry.ledger
        if ledger is not None:
            ledger.counting = False
        with self._lock:
            self.last = result
            self.state = "idle"
            self.telemetry.on_boundary = None
            self.done.set()

    def _fail(self, code: str, message: str) -> None:
        counter = self._counter
        try:
            if counter is not None and not self._leave(counter):
                counter.stopped = counter.stopped or message
                self._stop_soon()
                return
        except Exception:
            pass
        self.telemetry.record_error(RuntimeError(message))
        self._done({"ok": False, "error": code, "message": message})

    def _safe_point(self) -> None:
        """On the training thread, outside any operator: leave an expired count now."""
        counter = self._counter
        if counter is None:
            return
        if not self._expired and time.perf_counter() - self._t0 <= self._limit:
            return
        counter.stopped = counter.stopped or "the step ran past the count's time limit"
        if self._leave(counter):
            self._done({"ok": False, "error": "incomplete", "message": counter.stopped})

    def abandon(self) -> None:
        """The process exits (or the agent shuts down): leave the mode if we can, forget it."""
        if self.state == "armed":
            self.disarm()
            return
        counter = self._counter
        if self.state != "counting" or counter is None:
            return
        counter.stopped = "the process exited during the count"
        try:
            self._leave(counter)
        except Exception:
            pass
        self._done({"ok": False, "error": "exited", "message": counter.stopped})

    def leave_after_fork(self) -> None:
        """In a forked child (a DataLoader worker forked during the counted step): the child's
        thread inherits the dispatch-mode stack, and nothing would ever leave it there."""
        counter = self._counter
        if self.state != "counting" or counter is None:
            return
        try:
            if _current_mode() is counter.mode:
                counter.__exit__(None, None, None)
        except Exception:
            pass
        self._counter = None

    # --- safe points and samples (training thread, only while counting) -------------------------

    def _stop_soon(self) -> None:
        """The count is over (its time ran out, it failed, its request went): leave the mode
        at the next safe point of the training thread. Besides the next step and batch, that is
        the next module call: a global module hook, placed only now (torch.compile warns about
        global module hooks, and an ordinary count ends at the next step without one)."""
        with self._lock:
            if self._expired or self.state != "counting" or self._counter is None:
                return
            self._expired = True
            try:
                from torch.nn.modules.module import register_module_forward_pre_hook

                thread = self._thread

                def pre_hook(_module: Any, _args: Any) -> None:
                    if threading.get_ident() == thread:
                        try:
                            self._safe_point()
                        except Exception:
                            pass

                self._undo.append(register_module_forward_pre_hook(pre_hook).remove)
            except Exception as exc:
                self.telemetry.record_error(exc)

    def _watch_batches(self) -> None:
        """Add up the batches' leading dimension while counting (one step only)."""
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        previous = cls.__dict__.get("__next__")
        if previous is None:
            return
        thread = self._thread

        def __next__(it: Any) -> Any:
            batch = previous(it)
            if threading.get_ident() == thread:
                try:
                    self._safe_point()  # leaves a count that is over
                    tensor = _first_tensor(batch)
                    if tensor is not None and tensor.dim() >= 1:
                        self._samples = (self._samples or 0) + int(tensor.shape[0])
                except Exception:
                    pass
            return batch

        cls.__next__ = __next__

        def undo() -> None:
            if cls.__dict__.get("__next__") is __next__:
                cls.__next__ = previous

        self._undo.append(undo)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "message": message}
