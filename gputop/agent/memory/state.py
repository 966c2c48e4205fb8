"""The memory state a memory report carries besides its allocations, read inside the training
process: the model's storages (from the optimizer the step hook sees), the process's memory
and its limits (/proc, cgroup v2), the CUDA caching allocator's segments and counters; and the
report file itself (written whole or not at all, mode 0600).

The report format (``"format": "gputop-memory"``) is read back, untrusted, by
``gputop.capture.memory.report`` on the monitor's side.

Training process side: standard library only; torch comes in as the module object.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from gputop.agent.memory.summary import Storages

FORMAT = "gputop-memory"
VERSION = 1
MAX_SEGMENT_SIZES = 32  # the largest free blocks listed


def _storage(tensor: Any) -> tuple[int, int, str] | None:
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes(), str(tensor.device)
    except Exception:
        return None


def model_storages(optimizer: Any, device: str) -> Storages:
    """Parameters, their gradients and the optimizer's state tensors on ``device``, each
    storage once (tied weights share one)."""
    out = Storages()
    if optimizer is None:
        return out
    try:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    except Exception:
        return out
    def add(into: dict[int, int], tensor: Any) -> None:
        found = _storage(tensor)
        if found is not None and found[2] == device and found[0]:
            into.setdefault(found[0], found[1])

    for p in params:
        add(out.parameters, p)
        grad = getattr(p, "grad", None)
        if grad is not None:
            add(out.gradients, grad)
    try:
        states = list(optimizer.state.values())
    except Exception:
        states = []
    for state in states:
        if not isinstance(state, dict):
            continue
        for value in state.values():
            if hasattr(value, "untyped_storage"):  # a tensor (a step count may be a number)
                add(out.optimizer_state, value)
    return out


def param_device(optimizer: Any) -> str | None:
    """The device of the optimizer's first parameter (``cpu``, ``cuda:0``)."""
    try:
        for group in optimizer.param_groups:
            for p in group["params"]:
                return str(p.device)
    except Exception:
        return None
    return None


def _proc_status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                key, _, value = line.partition(b":")
                if key in (b"VmRSS", b"VmHWM", b"VmSize"):
                    out[key.decode()] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _cgroup_memory() -> dict[str, int | None]:
    """The cgroup v2 memory limit and use of this process (None where there is none)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            path = next((line.split("::", 1)[1].strip() for line in f
                         if line.startswith("0::")), None)
    except OSError:
        path = None
    out: dict[str, int | None] = {"cgroup_max": None, "cgroup_current": None}
    if path is None:
        return out
    base = Path("/sys/fs/cgroup") / path.lstrip("/")
    for name, key in (("memory.max", "cgroup_max"), ("memory.current", "cgroup_current")):
        try:
            text = (base / name).read_text().strip()
            out[key] = None if text == "max" else int(text)
        except (OSError, ValueError):
            pass
    return out


def process_memory() -> dict[str, int | None]:
    """RSS, its high-water mark, the address space and the limits that bound them."""
    status = _proc_status()
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return {
        "rss": status.get("VmRSS"),
        "rss_peak": status.get("VmHWM"),
        "address_space": status.get("VmSize"),
        "limit_address_space": None if soft == resource.RLIM_INFINITY else soft,
        **_cgroup_memory(),
    }


def cuda_allocator(torch: Any, index: int, snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """Reserved versus allocated on device ``index``: the segments (cudaMalloc'd) and their
    free blocks, the allocator's counters and settings, the device's own free and total."""
    out: dict[str, Any] = {}
    try:
        stats = torch.cuda.memory_stats(index)
    except Exception:
        stats = {}
    for key, name in (("allocated_bytes.all.current", "allocated"),
                      ("reserved_bytes.all.current", "reserved"),
                      ("active_bytes.all.current", "active"),
                      ("inactive_split_bytes.all.current", "inactive_split"),
                      ("allocated_bytes.all.peak", "allocated_peak"),
                      ("reserved_bytes.all.peak", "reserved_peak"),
                      ("num_alloc_retries", "alloc_retries"), ("num_ooms", "ooms")):
        value = stats.get(key)
        if isinstance(value, int):
            out[name] = value
    try:
        free, total = torch.cuda.mem_get_info(index)
        out["device_free"], out["device_total"] = int(free), int(total)
    except Exception:
        pass
    out["settings"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get(
        "PYTORCH_ALLOC_CONF") or ""
    if snapshot is None:
        return out
    settings = snapshot.get("allocator_settings") or {}
    if isinstance(settings, dict) and "expandable_segments" in settings:
        out["expandable_segments"] = bool(settings["expandable_segments"])
    segments = [s for s in snapshot.get("segments") or ()
                if s.get("device", index) == index]
    free_blocks = [b["size"] for s in segments for b in s.get("blocks") or ()
                   if b.get("state") == "inactive"]
    out["segments"] = {
        "count": len(segments),
        "large": sum(1 for s in segments if s.get("segment_type") == "large"),
        "small": sum(1 for s in segments if s.get("segment_type") == "small"),
        "reserved": sum(int(s.get("total_size") or 0) for s in segments),
        "allocated": sum(int(s.get("allocated_size") or 0) for s in segments),
        "free_blocks": len(free_blocks),
        "free": sum(free_blocks),
        "largest_free": max(free_blocks, default=0),
        "largest_free_blocks": sorted(free_blocks, reverse=True)[:MAX_SEGMENT_SIZES],
    }
    return out


def header(kind: str, device: str, started_at: float) -> dict[str, Any]:
    import sys

    torch = sys.modules.get("torch")
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": round(time.time(), 3),
        "process_started": round(started_at, 3),
        "torch": str(getattr(torch, "__version__", "?")),
        "device": device,
    }


def report_name(kind: str, now_s: float | None = None) -> str:
    """``<host>_<pid>.<time_ms>.<kind>.json``, beside the captures' traces."""
    ms = int((time.time() if now_s is None else now_s) * 1000)
    return f"{socket.gethostname()}_{os.getpid()}.{ms}.{kind}.json"


def write_report(directory: Path, report: dict[str, Any], kind: str) -> Path:
    """Write ``report`` into ``directory`` as JSON, mode 0600, under its final name only when
    complete (nothing half-written stays behind)."""
    data = json.dumps(report, separators=(",", ":"), allow_nan=False).encode()
    fd, staged = tempfile.mkstemp(prefix=".gputop-memory-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        final = directory / report_name(kind)
        os.replace(staged, final)
        return final
    except BaseException:
        try:
            os.unlink(staged)
        except OSError:
            pass
        raise
