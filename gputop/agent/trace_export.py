"""A capture's files, inside the training process: the capture directory, the trace's name, the
export (on the export thread) cut to the size budget by a child process (``trace_budget``), and
the profiler's activities. Used by ``profiling`` and ``memory``."""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from gputop.core.protocol import JSON_PER_STEP, default_capture_dir

CUT_TIMEOUT_S = 300.0  # the child process that cuts a trace to its budget, at most


class CaptureError(Exception):
    """A capture request that cannot be served: becomes an error reply ``code``/``message``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def prepare_capture_dir(out: str | None) -> Path:
    """Create the capture directory (0700) and make sure we can write in it, or CaptureError."""
    path = Path(out) if out else default_capture_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        probe = path / f".gputop-probe-{os.getpid()}-{threading.get_ident()}"
        probe.mkdir(mode=0o700)
        probe.rmdir()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CaptureError("capture-dir", f"cannot write traces to {path}: {reason}") from None
    return path


def trace_file_name(now_s: float | None = None) -> str:
    """``<host>_<pid>.<time_ms>.pt.trace.json.gz``: torch's tensorboard_trace_handler naming."""
    ms = int((time.time() if now_s is None else now_s) * 1000)
    return f"{socket.gethostname()}_{os.getpid()}.{ms}.pt.trace.json.gz"


class Written(NamedTuple):
    path: Path
    cut: list[str]  # what was cut to fit the budget, one line each
    json_bytes: int  # what the profiler wrote, before any cut


def write_trace(profiler: Any, directory: Path, budget: int | None = None) -> Written:
    """Export ``profiler``'s Chrome trace gzipped into ``directory`` with mode 0600, cut to
    ``budget`` bytes of JSON when it is larger.

    The raw JSON goes to a private temporary directory next to the target and the gzip file
    appears under its final name only when complete (os.replace), so no reader ever sees half a
    trace and nothing half-written stays behind on failure (disk full, directory gone).
    """
    import gzip
    import shutil
    import tempfile
    import zlib

    if _free_bytes(directory) < MIN_FREE_BYTES:
        # Kineto writes straight to the file; on a full disk it fails half way, reports the
        # file as missing and can keep its handle: do not start an export that cannot finish.
        raise OSError(errno.ENOSPC, f"no space left on device ({_free_bytes(directory)} bytes "
                                    "free)")
    tmpdir = tempfile.mkdtemp(prefix=".gputop-export-", dir=directory)  # mode 0700
    try:
        raw = os.path.join(tmpdir, "trace.json")
        profiler.export_chrome_trace(raw)
        with open(raw, "rb") as src:
            size = src.seek(0, os.SEEK_END)
            src.seek(max(0, size - 64))
            tail = src.read().rstrip()
            if not tail.endswith((b"}", b"]")):
                raise OSError(28, "trace export incomplete (disk full?)")
            src.seek(0)
            name = trace_file_name()
            staged = os.path.join(tmpdir, name)
            notes: list[str] = []
            if budget is not None and size > budget:
                notes = cut_trace(raw, staged, budget)
            else:
                fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                with (
                    os.fdopen(fd, "wb") as out,
                    gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=out,
                                  mtime=0) as gz,
                ):
                    shutil.copyfileobj(src, gz, 1 << 20)
        os.chmod(staged, 0o600)
        final = directory / name
        os.replace(staged, final)
        return Written(final, notes, size)
    except zlib.error as exc:
        raise OSError(5, f"compression failed: {exc}") from None
    except OSError as exc:
        # Measured before the partial files go: a failure on a full disk says so, whatever
        # the writer reported (Kineto's missing file reads "No such file or directory").
        if exc.errno != errno.ENOSPC and _free_bytes(directory) < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, "no space left on device") from None
        raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def cut_trace(raw: str, out: str, budget: int) -> list[str]:
    """Write ``raw`` to ``out`` (gzip) cut to ``budget`` bytes of JSON, in a child process at
    low priority (``trace_budget``): the training thread never shares its interpreter lock with
    this work. In this thread when no child can be started."""
    import json
    import subprocess

    why = f"over the budget of {JSON_PER_STEP >> 20} MB of JSON per recorded step"
    root = str(Path(__file__).resolve().parents[2])  # gputop's tree, for the child's path
    code = ("import os, sys; os.nice(10); sys.path.insert(0, sys.argv[1]); "
            "from gputop.agent.trace_budget import main; sys.exit(main(sys.argv[2:]))")
    if sys.executable:
        try:
            done = subprocess.run(
                [sys.executable, "-E", "-c", code, root, raw, out, str(budget), why],
                stdin=subprocess.DEVNULL, capture_output=True, timeout=CUT_TIMEOUT_S,
                env={**os.environ, "GPUTOP_AGENT": "0"}, check=False)
            if done.returncode == 0:
                return [str(n) for n in json.loads(done.stdout.decode().splitlines()[-1])]
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
    from gputop.agent.trace_budget import cut_to_budget

    return cut_to_budget(raw, out, budget, why)


# Below this much free space an export is refused or its failure called a full disk: a trace
# of even a few steps is megabytes of JSON.
MIN_FREE_BYTES = 1 << 20


def _free_bytes(directory: Path) -> int:
    try:
        st = os.statvfs(directory)
    except OSError:
        return MIN_FREE_BYTES  # unknown: let the write itself say what is wrong
    return st.f_bavail * st.f_frsize


def profile_all_threads_supported() -> bool:
    """Whether this torch can record other threads' ops from a profiler on this thread."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        from torch.profiler import _ExperimentalConfig

        _ExperimentalConfig(profile_all_threads=True)
    except Exception:
        return False
    return True


def trace_only(with_stack: bool) -> dict[str, Any]:
    """``experimental_config`` that skips building the profiler's Python event objects at
    stop (on the training thread): the agent only exports the trace. Not with the Python
    tracer (torch turns it off there, with a warning in the job's stderr), nor where this
    torch lacks it."""
    if with_stack:
        return {}
    try:
        from torch.profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(trace_only=True)}
    except (ImportError, TypeError):
        return {}


def profiler_activities() -> list[Any]:
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    # Only where the program has set CUDA up already: probing would initialise it for them.
    if torch.cuda.is_initialized():
        activities.append(ProfilerActivity.CUDA)
    return activities


def error_reply(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "message": message}


def no_window_reason() -> str:
    """Why this process cannot record a time window of all threads."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "the process has not imported torch; there is nothing to profile"
    return (
        f"torch {getattr(torch, '__version__', '?')} cannot profile the other threads of the "
        "process (no profile_all_threads); only step-aligned captures work here"
    )
