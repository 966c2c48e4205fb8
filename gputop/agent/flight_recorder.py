"""The agent's view of PyTorch's Flight Recorder: whether it is on, and this rank's buffer.

Flight Recorder keeps the last N collectives of every process group of a rank (its op, process
group, sequence number, sizes, dtypes, state) in a ring in C++. It is on when the job sets
``TORCH_FR_BUFFER_SIZE`` (or the older ``TORCH_NCCL_TRACE_BUFFER_SIZE``) to a positive number
before the process group is made; ``gputop run`` sets it when the job has not.

``fr_dump`` returns the ring as the JSON form PyTorch writes (``_dump_fr_trace_json``), parsed
and cut to fit one agent reply (``MAX_MESSAGE``): the newest entries are kept, stack frames
dropped. The dump runs on a helper thread and is given ``DUMP_TIMEOUT_S``: a dump that does not
come back in time is an error reply, never a stuck agent. Imported inside the training
process: stdlib only; torch is read from ``sys.modules``, never imported here.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from gputop.core.protocol import MAX_MESSAGE, encode

ENV_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_TIMEOUT_S = 3.0  # the longest a dump may take before the request gives up on it
MAX_DUMP_BYTES = 64 << 20  # a dump larger than this is not parsed (2000 entries are ~1.5 MB)
_REPLY_ROOM = MAX_MESSAGE - 2048  # the reply's own fields and the encoding's slack


def buffer_size(environ: dict[str, str] | os._Environ[str] | None = None) -> tuple[int, str | None]:
    """(entries, the variable that set them) of the Flight Recorder ring; (0, None) when off."""
    env = os.environ if environ is None else environ
    for name in ENV_NAMES:
        value = (env.get(name) or "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), name
    return 0, None


def status() -> dict[str, Any]:
    """What the agent's ``status`` says about Flight Recorder."""
    size, name = buffer_size()
    result: dict[str, Any] = {"enabled": size > 0, "buffer": size}
    if name:
        result["env"] = name
    else:
        result["hint"] = ("set TORCH_FR_BUFFER_SIZE=2000 in the job's environment (gputop run "
                          "does it) to record its collectives")
    return result


def _dump_json() -> bytes:
    module = sys.modules.get("torch._C._distributed_c10d")
    if module is None:
        torch = sys.modules.get("torch")
        if torch is None:
            raise LookupError("torch is not imported in this process")
        module = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    dump = getattr(module, "_dump_fr_trace_json", None)
    if dump is None:
        raise LookupError("this torch has no _dump_fr_trace_json")
    return bytes(dump(includeCollectives=True, onlyActive=False))


def _run_bounded(timeout: float) -> bytes:
    """The dump on a helper thread, waited for ``timeout`` seconds at most."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["data"] = _dump_json()
        except BaseException as exc:  # reported, never raised into the agent
            box["error"] = exc

    thread = threading.Thread(target=work, name="gputop-fr-dump", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the Flight Recorder dump took over {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["data"]


def fit_reply(dump: dict[str, Any], header: dict[str, Any]) -> dict[str, Any]:
    """``header`` plus the dump with as many of its newest entries as fit one reply."""
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict)]
    for e in entries:
        e.pop("frames", None)  # stack frames: large, and the monitor reads stacks with py-spy
    kept = {k: v for k, v in dump.items() if k != "entries"}
    # Binary search on how many of the newest entries fit.
    lo, hi = 0, len(entries)
    best: dict[str, Any] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        reply = {**header, "entries_total": len(entries), "entries_dropped": len(entries) - mid,
                 "dump": {**kept, "entries": entries[len(entries) - mid:]}}
        try:
            size = len(encode(reply))
        except ValueError:
            size = MAX_MESSAGE + 1
        if size <= _REPLY_ROOM:
            best, lo = reply, mid + 1
        else:
            hi = mid - 1
    if best is None:
        return {"ok": False, "error": "too-large", "message": "the dump's header alone is too large"}
    return best


def request(message: dict[str, Any], rank: int | None) -> dict[str, Any]:
    """The ``fr_dump`` command: this rank's Flight Recorder buffer, bounded."""
    extra = set(message) - {"cmd"}
    if extra:
        return {"ok": False, "error": "bad-request",
                "message": f"unexpected field(s) for fr_dump: {', '.join(sorted(extra))[:200]}"}
    size, _ = buffer_size()
    if size <= 0:
        return {"ok": False, "error": "fr-off", "message": status()["hint"]}
    t0 = time.perf_counter()
    try:
        raw = _run_bounded(DUMP_TIMEOUT_S)
    except TimeoutError as exc:
        return {"ok": False, "error": "timeout", "message": str(exc)}
    except Exception as exc:
        return {"ok": False, "error": "fr-unavailable",
                "message": f"no Flight Recorder dump: {type(exc).__name__}: {exc}"[:300]}
    if len(raw) > MAX_DUMP_BYTES:
        return {"ok": False, "error": "too-large",
                "message": f"the dump is {len(raw)} bytes, over {MAX_DUMP_BYTES}"}
    try:
        dump = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return {"ok": False, "error": "fr-unavailable",
                "message": f"the dump is not JSON ({type(exc).__name__})"}
    if not isinstance(dump, dict):
        return {"ok": False, "error": "fr-unavailable", "message": "the dump is not an object"}
    header = {"ok": True, "pid": os.getpid(), "rank": rank, "time": time.time(),
              "dump_s": round(time.perf_counter() - t0, 6), "buffer": size}
    return fit_reply(dump, header)
