"""torch.compile's health, read inside the training process (the agent's ``compile`` status).

Nothing here runs on the training thread's hot path. What torch.compile already keeps is read
on the agent's socket thread when the monitor asks for ``status`` (about once a second), and
two callbacks run on the training thread only while it compiles (a few microseconds against
compiles of tens of milliseconds to minutes). Read, never written: the job's own compile
state is untouched.

The hooks, with the torch versions whose source has them (checked in torch 2.13's source;
older bounds from when each name appeared, see docs/compile.md):

* ``torch._dynamo.utils.get_compilation_metrics()`` (2.2+; a deque of the last 64
  ``CompilationMetrics``): each frame compile with its function (``co_name``, file, first
  line), its ``compile_id`` ("frame/attempt": attempt 1 and up are recompiles), its time, and
  ``recompile_reason`` (2.6+: the guard that failed, "tensor 'x' size mismatch at index 0.
  expected 32, actual 17"); a compile that failed on the recompile limit has ``fail_reason``
  "Dynamo recompile limit exceeded" (older: "cache_size_limit reached").
* ``torch._dynamo.utils.graph_break_reasons`` (2.0+): every graph break with its reason and
  the user's stack (file, line, source text).
* ``torch._dynamo.callback.callback_handler`` start/end callbacks (2.6+; triggers DYNAMO,
  LAZY_BACKWARD, CUDAGRAPH_RECORDING in 2.7+): the seconds the training thread was blocked
  compiling (forward, the lazily compiled backward), and each CUDA-graph recording of
  inductor's cudagraph trees (a second recording for one compile id is a re-record).
* ``torch._dynamo.utils.counters`` (2.0+): ``stats``/``frames`` totals and inductor's
  ``cudagraph_skips`` (a function sent back to eager by the cudagraph trees).

Whatever is missing is named in ``unavailable`` rather than guessed.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

from gputop.core.guard_change import change, resumed

RECENT_S = 600.0  # events kept for the monitor's windows (its rules look at 5 minutes)
MAX_EVENTS = 48  # recompile / fallback events in a reply
MAX_FUNCTIONS = 16
MAX_BREAKS = 12
MAX_BLOCKED = 128  # compile intervals kept (the monitor sums the recent ones)
MAX_TEXT = 200
WARMUP_STEPS = 2  # a first compile after this many optimizer steps is no longer warm-up
_SEEN = 1024
_OWN = str(Path(__file__).resolve().parent) + "/"  # gputop/agent/
_TORCH = "/torch/"  # a frame in torch's own files (a path holds it: site-packages/torch/...)  # compile metrics already read (keys), to take each once

_LIMIT = re.compile(r"recompile.?limit|cache.?size.?limit", re.IGNORECASE)


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    text = "" if value is None else str(value)
    text = "".join(c if c.isprintable() else " " for c in text.split("\n", 1)[0])
    return text[:limit]


def _frame_of(compile_id: Any) -> tuple[str, int] | None:
    """("frame", attempt) from a compile id "3/1" (or "3/1_2", "!0/3/1"); None if unknown."""
    text = str(compile_id or "")
    match = re.search(r"(\d+)/(\d+)(?:_\d+)?$", text)
    return (match.group(1), int(match.group(2))) if match else None


def describe_change(reason: str) -> str:
    """The guard failure in a user's words: "size of `x` dim 0 changed 32 -> 17"."""
    return str(change(reason)["text"])


class CompileWatch:
    """Reads torch.compile's state on request; two compile-time callbacks time the blocking."""

    def __init__(self, steps: Any = None) -> None:
        self._steps = steps or (lambda: 0)  # the optimizer steps counted so far
        self._lock = threading.Lock()  # between the socket threads that poll
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._frames: dict[str, dict[str, Any]] = {}  # frame id -> its function and counts
        self._events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._breaks: dict[tuple, dict[str, Any]] = {}
        self._breaks_read = 0
        self._open: dict[tuple, tuple[float, int]] = {}  # (trigger, id) -> (start, steps)
        # (end wall time, seconds, trigger, compile id, after warm-up): appended on the
        # training thread, read on the socket thread (deque appends are atomic)
        self._blocked: deque[tuple[float, float, str, str, bool]] = deque(maxlen=MAX_BLOCKED)
        self._blocked_total = [0.0, 0.0]  # all, after warm-up
        self._recordings: dict[str, list[int]] = {}  # compile id -> [recordings, first step]
        self.rerecords = 0
        self._rerecords: deque[float] = deque(maxlen=32)  # when a compile id recorded again
        self._registered = False
        self._callbacks: tuple[Any, Any] | None = None
        self.compiles = 0
        self.recompiles = 0
        self.fallbacks = 0
        self.errors = 0
        self.limit: int | None = None  # the recompile limit, as the training thread sees it

    # --- the training thread, while it compiles ----------------------------------------------

    def dynamo_imported(self, _module: Any = None) -> None:
        """Register the compile callbacks (once); safe on any thread. Never raises."""
        if self._registered:
            return
        self._registered = True
        try:
            from torch._dynamo.callback import callback_handler
        except Exception:
            return  # torch < 2.6: compile time from the metrics alone
        try:
            start, end = self._on_start, self._on_end
            callback_handler.register_start_callback(start)
            callback_handler.register_end_callback(end)
            self._callbacks = (start, end)
        except Exception:
            self.errors += 1

    def _on_start(self, args: Any) -> None:
        try:
            key = (getattr(args.callback_trigger, "name", "?"), str(args.compile_id))
            # dynamo's config is per thread (2.13): the training thread's limit is the one
            self.limit = _limit_value()
            if len(self._open) < 64:
                self._open[key] = (time.perf_counter(), int(self._steps()))
        except Exception:
            self.errors += 1

    def _on_end(self, args: Any) -> None:
        try:
            trigger = getattr(args.callback_trigger, "name", "?")
            cid = str(args.compile_id)
            started = self._open.pop((trigger, cid), None)
            if trigger == "CUDAGRAPH_RECORDING":
                self._recorded(cid, started[1] if started is not None else int(self._steps()))
            if started is None:
                return
            seconds = time.perf_counter() - started[0]
            frame = _frame_of(cid)
            # Warm-up: first compiles before the job's first steps. A recompile, or a first
            # compile later in the run, blocks steps that were already running.
            late = (frame is not None and frame[1] > 0) or started[1] >= WARMUP_STEPS
            self._blocked.append((time.time(), seconds, trigger, cid, late))
            self._blocked_total[0] += seconds
            if late:
                self._blocked_total[1] += seconds
        except Exception:
            self.errors += 1

    def _recorded(self, cid: str, step: int) -> None:
        """A CUDA-graph recording for compile id ``cid``. Its forward and backward record
        under the same id in one step; a recording in a later step (or a second one of an
        inference loop, which counts no steps) is a re-record: an input changed."""
        seen = self._recordings.get(cid)
        if seen is None:
            if len(self._recordings) < 4096:
                self._recordings[cid] = [1, step]
            return
        seen[0] += 1
        if step != seen[1] or step == 0:
            self.rerecords += 1
            self._rerecords.append(round(time.time(), 3))

    def remove(self) -> None:
        """Unregister the callbacks (tests, benchmarks, the agent's shutdown)."""
        callbacks, self._callbacks = self._callbacks, None
        if callbacks is None:
            return
        try:
            from torch._dynamo.callback import callback_handler

            callback_handler.remove_start_callback(callbacks[0])
            callback_handler.remove_end_callback(callbacks[1])
        except Exception:
            pass

    # --- the socket thread: read what torch.compile keeps ----------------------------------

    def status(self) -> dict[str, Any] | None:
        """The ``compile`` part of the agent's status; None while torch.compile is unused."""
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None or "torch._dynamo" not in sys.modules:
            return None
        self.dynamo_imported()  # imported some way the import hook missed
        with self._lock:
            unavailable: list[str] = []
            self._read_metrics(utils, unavailable)
            self._read_breaks(utils, unavailable)
            counters = self._counters(utils)
            if self.compiles == 0 and not self._breaks and not counters.get("frames"):
                return None
            return self._reply(utils, counters, unavailable)

    def _read_metrics(self, utils: Any, unavailable: list[str]) -> None:
        getter = getattr(utils, "get_compilation_metrics", None)
        if getter is None:
            unavailable.append("recompiles and their reasons (no get_compilation_metrics: "
                               "torch < 2.2)")
            return
        try:
            metrics = getter()
        except Exception:
            self.errors += 1
            return
        if metrics and not hasattr(metrics[-1], "recompile_reason"):
            unavailable.append("the guard that failed (no recompile_reason: torch < 2.6)")
        for m in metrics:
            if getattr(m, "is_forward", True) is False or getattr(m, "is_runtime", False):
                continue  # a backward's compile (timed by the callbacks) or a runtime event
            key = (str(getattr(m, "compile_id", "")), getattr(m, "start_time_us", None),
                   getattr(m, "start_time", None))
            if key in self._seen:
                continue
            self._seen[key] = None
            if len(self._seen) > _SEEN:
                self._seen.popitem(last=False)
            self._take(m)

    def _take(self, m: Any) -> None:
        frame = _frame_of(getattr(m, "compile_id", None))
        frame_id, attempt = frame if frame is not None else ("?", 0)
        info = self._frames.get(frame_id)
        name = getattr(m, "co_name", None)
        if info is None and len(self._frames) < 256:
            info = self._frames[frame_id] = {"name": None, "file": None, "line": None,
                                             "compiles": 0, "recompiles": 0, "fallback": False,
                                             "compile_s": 0.0, "last_reason": None}
        if info is None:
            return
        if name and info["name"] is None:
            info.update(name=_text(name, 120), file=_text(getattr(m, "co_filename", ""), 300),
                        line=getattr(m, "co_firstlineno", None))
        seconds = getattr(m, "entire_frame_compile_time_s", None)
        if isinstance(seconds, (int, float)):
            info["compile_s"] += float(seconds)
        reason = _text(getattr(m, "recompile_reason", None) or "", 400)
        fail = _text(getattr(m, "fail_reason", None) or "", 400)
        ended = getattr(m, "end_time_us", None)
        when = ended / 1e6 if isinstance(ended, (int, float)) and ended > 0 else time.time()
        if _LIMIT.search(fail):
            info["fallback"] = True
            self.fallbacks += 1
            said = re.search(r"currently set to (\d+)",
                             str(getattr(m, "fail_reason", "") or "")[:2000])
            if said:
                self.limit = int(said.group(1))
            self._event("fallback", info, when, reason, frame_id, limit=self._limit())
            return
        self.compiles += 1
        info["compiles"] += 1
        if attempt > 0:
            info["recompiles"] += 1
            self.recompiles += 1
            info["last_reason"] = describe_change(reason) if reason else None
            self._event("recompile", info, when, reason, frame_id)

    def _limit(self) -> int | None:
        return self.limit if self.limit is not None else _limit_value()

    def _event(self, kind: str, info: dict[str, Any], when: float, reason: str,
               frame_id: str, **extra: Any) -> None:
        self._events.append({"kind": kind, "t": round(when, 3), "frame": frame_id[:12],
                             **_where(info),
                             "reason": _text(reason),
                             "change": describe_change(reason) if reason else None, **extra})

    def _read_breaks(self, utils: Any, unavailable: list[str]) -> None:
        reasons = getattr(utils, "graph_break_reasons", None)
        if not isinstance(reasons, list):
            unavailable.append("graph breaks (no torch._dynamo.utils.graph_break_reasons)")
            return
        if len(reasons) < self._breaks_read:
            self._breaks_read = 0  # torch._dynamo.reset() cleared it
        new = reasons[self._breaks_read:self._breaks_read + 4096]
        self._breaks_read += len(new)
        for r in new:
            stack = list(getattr(r, "user_stack", None) or [])
            # The agent's own timing wrapper of Tensor.item() & co. is a frame dynamo sees:
            # the break belongs to the user's line that called it.
            while stack and str(getattr(stack[-1], "filename", "")).startswith(_OWN):
                stack.pop()
            if not stack:
                continue  # a frame of that wrapper alone: the user's break is the one above
            top = stack[-1]
            where = (_text(getattr(top, "filename", ""), 300), getattr(top, "lineno", None),
                     _text(getattr(top, "name", ""), 120))
            why = _text(getattr(r, "reason", ""))
            key = (why, *where)
            entry = self._breaks.get(key)
            if entry is None:
                if len(self._breaks) >= 64:
                    continue
                entry = self._breaks[key] = {
                    "reason": why, "file": where[0], "line": where[1], "function": where[2],
                    "code": _text(getattr(top, "line", ""), 160),
                    "count": 0, "t": round(time.time(), 3)}
            entry["count"] += 1

    @staticmethod
    def _counters(utils: Any) -> dict[str, dict[str, int]]:
        counters = getattr(utils, "counters", None)
        out: dict[str, dict[str, int]] = {}
        if counters is None:
            return out
        for group, keys in (("stats", ("unique_graphs", "calls_captured")),
                            ("frames", ("total", "ok")),
                            ("inductor", ("cudagraph_skips",
                                          "cudagraph_recorded_non_static_inputs"))):
            try:
                counter = counters.get(group)
                if counter:
                    out[group] = {k: int(counter.get(k, 0)) for k in keys}
            except Exception:
                continue  # the training thread grew it meanwhile: the next poll reads it
        return out

    def _reply(self, utils: Any, counters: dict[str, dict[str, int]],
               unavailable: list[str]) -> dict[str, Any]:
        now = time.time()
        functions = sorted(self._frames.values(),
                           key=lambda f: (-f["recompiles"], -f["compiles"]))[:MAX_FUNCTIONS]
        breaks = sorted(self._breaks.values(), key=lambda b: -b["count"])[:MAX_BREAKS]
        blocked = [(round(t, 3), round(s, 4), trig, late) for t, s, trig, _, late
                   in list(self._blocked) if t > now - RECENT_S]
        if self._callbacks is None:
            unavailable.append("seconds blocked in compilation of backwards and CUDA-graph "
                               "recordings (no torch._dynamo.callback: torch < 2.6)")
        recordings = sum(n for n, _ in list(self._recordings.values()))
        return {
            "torch": _text(getattr(sys.modules.get("torch"), "__version__", "?"), 40),
            "compiles": self.compiles,
            "recompiles": self.recompiles,
            "fallbacks": self.fallbacks,
            "recompile_limit": self._limit(),
            "graph_breaks": len(self._breaks),
            "compile_s": round(self._blocked_total[0] or sum(
                f["compile_s"] for f in self._frames.values()), 3),
            "blocked_after_warmup_s": round(self._blocked_total[1], 3),
            "steps": int(self._steps()),
            "functions": [{**_where(f), "compiles": f["compiles"],
                           "recompiles": f["recompiles"], "fallback": f["fallback"],
                           "compile_s": round(f["compile_s"], 3),
                           "last_change": f["last_reason"]}
                          for f in functions if f["name"] is not None
                          and not str(f["file"]).startswith(_OWN)],
            "events": [e for e in self._events if e["t"] > now - RECENT_S],
            "breaks": breaks,
            "blocked": blocked[-MAX_BLOCKED:],
            "cudagraph": {"recordings": recordings, "rerecords": self.rerecords,
                          "rerecord_times": [t for t in self._rerecords if t > now - RECENT_S],
                          "skips": counters.get("inductor", {}).get("cudagraph_skips", 0)}
            if recordings or counters.get("inductor") else None,
            "counters": counters,
            "errors": self.errors,
            "unavailable": unavailable,
        }


def _where(info: dict[str, Any]) -> dict[str, Any]:
    """A frame's user function: a resume function after a graph break is named after the
    function it continues ("forward (after line 14)")."""
    name = info.get("name") or "?"
    if _TORCH in str(info.get("file") or ""):
        # torch.compile(module) compiles torch's own wrapper of the module's call
        name = f"{name} (torch's call of a compiled nn.Module)"
    found = resumed(name)
    if found:
        name = f"{found[0]} (after line {found[1]})"
    return {"function": name, "file": info.get("file"), "line": info.get("line")}


def _limit_value() -> int | None:
    config = sys.modules.get("torch._dynamo.config")
    for name in ("recompile_limit", "cache_size_limit"):  # 2.7+, before
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None
