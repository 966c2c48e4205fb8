"""Run py-spy on a process and its DataLoader workers, bounded, and build a ``StackReport``.

Two ``py-spy record`` runs sample side by side for the same seconds at the same rate: one
keeps only the samples in which a thread was running (where the CPU goes), the other every
thread at every tick (so the idle share, and where idle threads wait, are the difference).
Then ``py-spy dump`` gives every thread's stack at that moment, for the main process and up to
MAX_DUMPS workers.

Both run with ``--nonblocking``: py-spy reads the target's memory without stopping it, so the
training run is never paused (a tracer that died while the target was stopped could leave it
stopped), at the price of an occasional torn sample, which py-spy counts as an error and
drops. Every py-spy run has a deadline and is killed past it; its output is read up to a
size limit from a private temporary directory that is removed afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gputop.core.pidns import pid_alive
from gputop.stacks.access import StacksError, explain_refusal, refusal
from gputop.stacks.profile import StackReport, build_report, parse_dump, parse_raw

DEFAULT_RATE = 100  # samples per second per thread: py-spy's own default
MAX_SECONDS = 600
MAX_OUTPUT = 16 * 1024 * 1024  # bytes of one raw file read; beyond that the file is refused
MAX_DUMP = 4 * 1024 * 1024
MAX_DUMPS = 16  # processes whose threads are dumped: the main one and 15 workers
_CHUNK = 65536
DUMP_TIMEOUT_S = 10.0
START_GRACE_S = 15.0  # py-spy's own start-up, on a busy machine
PY_SPY_ENV = "GPUTOP_PY_SPY"  # path of the py-spy binary to use; empty: never use py-spy

ShouldStop = Callable[[], bool]


def find_py_spy() -> str | None:
    """The py-spy binary: $GPUTOP_PY_SPY, else the one installed beside this Python (a
    virtualenv's bin/ need not be on PATH), else on PATH."""
    chosen = os.environ.get(PY_SPY_ENV)
    if chosen is not None:
        return chosen if chosen and os.access(chosen, os.X_OK) else None
    for folder in _script_folders():
        candidate = os.path.join(folder, "py-spy")
        if folder and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("py-spy")


def _script_folders():
    """Where pip puts this Python's commands: beside it, and in its (virtualenv's) prefix;
    then where sysconfig says (a distribution's own scheme: /usr/local/bin), which is only
    loaded when those fail (its build variables are ~0.2 MiB in the monitor)."""
    yield os.path.dirname(sys.executable)
    yield os.path.join(sys.prefix, "bin")
    import sysconfig

    yield sysconfig.get_path("scripts")


NOT_INSTALLED = "py-spy is not installed: `pip install py-spy` (gputop depends on it)"


def unusable_reason(pid: int) -> str | None:
    """Why the stacks of ``pid`` cannot be read (one line), or None when they can. Costs no
    ptrace: the TUI asks this before it opens the stacks view."""
    if find_py_spy() is None:
        return NOT_INSTALLED
    try:
        return refusal(pid)
    except StacksError as exc:
        return str(exc)


def _read_bounded(path: Path, limit: int) -> str | None:
    """The file as text, None when it holds more than ``limit`` bytes. Read in chunks: one
    read of ``limit + 1`` bytes allocates that much whatever the file holds (16 MiB in the
    monitor for a dump of a few KiB)."""
    chunks: list[bytes] = []
    size = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(min(_CHUNK, limit + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    return None
    except OSError:
        return ""
    return b"".join(chunks).decode("utf-8", errors="replace")


def _failure(pid: int, stderr: str) -> StacksError:
    """py-spy's error output as one line of ours (its own is a Rust backtrace)."""
    text = stderr.lower()
    if not pid_alive(pid, zombie_alive=False):
        return StacksError(f"no process with pid {pid} (it ended)", "no-process")
    if "permission denied" in text or "operation not permitted" in text:
        return StacksError(explain_refusal(pid), "denied")
    if ("python version" in text or "python interpreter" in text or "libpython" in text
            or "no python processes" in text):
        return StacksError(f"pid {pid} is not a Python process (py-spy found no Python "
                           "interpreter in it or under it)", "not-python")
    first = next((line.strip() for line in stderr.splitlines()
                  if line.strip().startswith("Error:")), stderr.strip().splitlines()[0]
                 if stderr.strip() else "no output")
    first = " ".join(first.removeprefix("Error:").split())[:200]
    return StacksError(f"py-spy could not read pid {pid}: {first}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def _wait_all(procs: list[subprocess.Popen], deadline: float,
              should_stop: ShouldStop | None) -> bool:
    """Wait for every process until ``deadline``; False (all killed) on timeout or stop."""
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline or (should_stop is not None and should_stop()):
            for p in procs:
                _stop(p)
            return False
        time.sleep(0.05)
    return True


TIMEOUT_RETRIES = 1


def timeout_message(pid: int) -> str:
    """What to do when py-spy twice did not finish in time: the host's load says why."""
    try:
        load = f"load {os.getloadavg()[0]:.0f} on {os.cpu_count()} cores"
    except OSError:
        load = "a busy host"
    return (f"py-spy did not finish sampling pid {pid} in time, twice ({load}): run the "
            f"command again when the host is less busy, or sample less with "
            f"`gputop stacks {pid} --seconds 1`")


def _start_records(binary: str, pid: int, whole: int, rate: int, workdir: Path,
                   runs: dict[str, bool]) -> dict[str, subprocess.Popen]:
    """py-spy record runs (with and without idle threads), their output logged in
    ``workdir``; each attempt's files replace the last's."""
    procs: dict[str, subprocess.Popen] = {}
    for name, with_idle in runs.items():
        with open(workdir / f"{name}.log", "wb") as log:  # the child keeps its own handle
            procs[name] = subprocess.Popen(
                _record_command(binary, pid, whole, rate, workdir / f"{name}.raw", with_idle),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "RUST_BACKTRACE": "0"})
    return procs


def _record_command(binary: str, pid: int, seconds: int, rate: int, out: Path,
                    idle: bool) -> list[str]:
    cmd = [binary, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate),
           "--format", "raw", "--output", str(out), "--subprocesses", "--threads",
           "--full-filenames", "--nonblocking"]
    return [*cmd, "--idle"] if idle else cmd


def _dump(binary: str, pid: int, workdir: Path, timeout: float = DUMP_TIMEOUT_S) -> str | None:
    out = workdir / f"dump-{pid}.json"
    try:
        with open(out, "wb") as sink:
            subprocess.run([binary, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                           stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.DEVNULL,
                           timeout=max(0.1, timeout), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _read_bounded(out, MAX_DUMP)


def _tree(pid: int) -> dict[int, int]:
    """pid -> parent pid of every process under ``pid``."""
    try:
        import psutil

        out = {}
        for child in psutil.Process(pid).children(recursive=True):
            try:
                out[child.pid] = child.ppid()
            except psutil.Error:
                pass
        return out
    except Exception:  # gone, or not ours to list: the recording still names its workers
        return {}


def sample_stacks(pid: int, seconds: float = 3.0, rate: int = DEFAULT_RATE, *,
                  idle: bool = True, dump: bool = True,
                  should_stop: ShouldStop | None = None) -> StackReport:
    """Sample ``pid`` and the processes under it for ``seconds`` (whole seconds, at least 1:
    py-spy's unit) and return the report. Every failure raises ``StacksError`` with one line;
    ``should_stop()`` turning true abandons the sampling (StacksError "cancelled")."""
    if pid <= 0:
        raise StacksError("PID must be a positive process id", "error")
    binary = find_py_spy()
    if binary is None:
        raise StacksError(NOT_INSTALLED, "no-py-spy")
    why = refusal(pid)  # raises for a missing process
    if why is not None:
        raise StacksError(why, "denied")
    whole = max(1, min(MAX_SECONDS, round(seconds)))
    workdir = Path(tempfile.mkdtemp(prefix="gputop-stacks-"))  # 0700, ours
    try:
        runs = {"active": False, **({"all": True} if idle else {})}
        procs: dict[str, subprocess.Popen] = {}
        # A busy host can keep py-spy from starting in time: one more try, with twice the
        # grace, before saying so (the process is only read, never slowed for long).
        for attempt in range(1 + TIMEOUT_RETRIES):
            procs = _start_records(binary, pid, whole, rate, workdir, runs)
            grace = START_GRACE_S * (1 + attempt)
            finished = _wait_all(list(procs.values()), time.monotonic() + whole + grace,
                                 should_stop)
            if finished or (should_stop is not None and should_stop()):
                break
        if not finished:
            if should_stop is not None and should_stop():
                raise StacksError(f"sampling of pid {pid} cancelled", "cancelled")
            raise StacksError(timeout_message(pid))
        texts, errors = {}, 0
        for name, proc in procs.items():
            log = _read_bounded(workdir / f"{name}.log", 65536) or ""
            raw = _read_bounded(workdir / f"{name}.raw", MAX_OUTPUT)
            if raw is None:
                raise StacksError(f"py-spy wrote more than {MAX_OUTPUT >> 20} MiB of stacks "
                                  f"for pid {pid}; try fewer --seconds")
            if proc.returncode != 0 and not raw.strip():
                raise _failure(pid, log)
            texts[name] = raw
            found = re.search(r"Errors: (\d+)", log)
            errors = max(errors, int(found.group(1)) if found else 0)
        active, bad = parse_raw(texts["active"])
        everything, bad_all = parse_raw(texts["all"]) if idle else (None, 0)
        dumps = {}
        tree = _tree(pid)
        if dump and not (should_stop is not None and should_stop()):
            for target in [pid, *tree][:MAX_DUMPS]:
                text = _dump(binary, target, workdir)
                threads = parse_dump(text, target) if text else []
                if threads:
                    dumps[target] = threads
        report = build_report(pid, float(whole), rate, active, everything, dumps,
                              sample_errors=errors, unparsed=bad + bad_all, parents=tree)
        if not pid_alive(pid, zombie_alive=False):
            report.notes.append(f"pid {pid} ended during the sampling")
        return report
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
