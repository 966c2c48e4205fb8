"""Start and stop the demo's stand-in processes, one per simulated GPU."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from typing import IO

import gputop
from gputop.sim.scenarios import Scenario

# The stand-ins run in a folder that holds no Python code, so that nothing in the user's
# current folder (a `gputop/` checkout, a `torch.py`) can shadow the packages they import.
NEUTRAL_CWD = "/"
# The directory gputop itself was imported from: first on the stand-ins' path, so they run
# this very gputop (an editable install's finder comes after the path in Python's search).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gputop.__file__)))
WATCH_S = 0.5  # how often a running demo looks for a stand-in that ended
ERROR_TAIL = 4096  # bytes of a failed stand-in's stderr read for its last line


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def standin_command(scenario: Scenario, index: int, parent: int, trainer: bool = True,
                    origin: float | None = None) -> list[str]:
    """The command of GPU ``index``'s stand-in. In `input-starved` and `tour`, GPU 0 (an
    input-starved GPU) runs a real torch training loop with the agent (when torch is installed
    and ``trainer``), so `p` captures real steps and the agent's FLOP count, steps and goodput
    give MFU and J/step against the simulated board; its DataLoader workers burn a core each
    and still cannot keep up, like the plain stand-in's. ``origin``: time.monotonic() when the
    simulated driver's clock started (a stand-in that takes turns with its GPU follows it)."""
    gpu = scenario.gpus[index]
    if index == 0 and gpu.kind == "input-starved" and trainer and torch_available():
        return [sys.executable, "-m", "gputop.demo.train", "--parent-pid", str(parent),
                "--num-workers", str(gpu.workers)]
    if gpu.compiled and trainer and torch_available():  # torch.compile's recompile
        return [sys.executable, "-m", "gputop.demo.train", "--parent-pid", str(parent),
                "--compile", "--transform-passes", "1", "--step-sleep-ms", "100"]
    return [sys.executable, "-m", "gputop.demo.standin", gpu.standin,
            "--workers", str(gpu.workers), "--parent", str(parent),
            *(["--origin", repr(origin)] if origin is not None else [])]


def forked_workers(scenario: Scenario, index: int, trainer: bool = True) -> int:
    """How many worker processes GPU ``index``'s stand-in forks: the torch.compile trainer
    loads its few batches in the main process."""
    gpu = scenario.gpus[index]
    return 0 if gpu.compiled and trainer and torch_available() else gpu.workers


def standin_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def _last_line(err: IO[bytes]) -> str:
    """The last non-empty line a stand-in wrote on stderr (a traceback's is the error)."""
    from gputop.core.format import safe_text

    try:
        size = err.seek(0, os.SEEK_END)
        err.seek(max(0, size - ERROR_TAIL))
        lines = [line.strip() for line in err.read().decode(errors="replace").splitlines()]
    except (OSError, ValueError):
        return ""
    return safe_text(next((line for line in reversed(lines) if line), ""))[:200]


def _launch(command: list[str], env: dict[str, str], stderr) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        cwd=NEUTRAL_CWD,
        env=env,
        start_new_session=True,  # a Ctrl-C in gputop's terminal is not theirs
    )


class StandIns:
    """The real processes behind a scenario's GPUs. Use as a context manager.

    ``trainer``: start the real torch trainer where the scenario has one (a one-shot snapshot
    does not: importing torch takes seconds, and its agent would have no step to report yet).
    ``on_failure``: told, in one line each, of a stand-in that ends while the demo runs (they
    run until stopped), from a thread of its own."""

    def __init__(self, scenario: Scenario, trainer: bool = True,
                 on_failure: Callable[[str], None] | None = None,
                 origin: float | None = None) -> None:
        self.scenario = scenario
        self.trainer = trainer
        self.on_failure = on_failure
        self.origin = origin  # the simulated driver's clock start (time.monotonic)
        self.procs: dict[int, subprocess.Popen] = {}
        self.mig_procs: dict[int, list[subprocess.Popen]] = {}  # per MIG device, in order
        self._stderr: dict[int, IO[bytes]] = {}
        self._told: set[int] = set()
        self._stopping = threading.Event()
        self._watch: threading.Thread | None = None

    def start(self, skip: Collection[int] = ()) -> dict[int, list[int]]:
        """Launch one stand-in per GPU (but those in ``skip``); return {gpu index: [pid]}."""
        me = os.getpid()
        env = standin_env()
        for index, gpu in enumerate(self.scenario.gpus):
            if index in skip:
                continue  # a real process of the user's stands there (GPUTOP_DEMO_PIDS)
            if gpu.mig:  # MIG: a stand-in per MIG device that runs work
                self.mig_procs[index] = [
                    _launch([sys.executable, "-m", "gputop.demo.standin", piece.standin,
                             "--parent", str(me)], env, subprocess.DEVNULL)
                    for piece in gpu.mig if piece.standin is not None]
                continue
            # stderr goes to an unnamed file: read only when the stand-in fails.
            self._stderr[index] = tempfile.TemporaryFile(prefix="gputop-standin-")
            self.procs[index] = _launch(
                standin_command(self.scenario, index, me, self.trainer, self.origin), env,
                self._stderr[index])
        if self.on_failure is not None and self.procs:
            self._watch = threading.Thread(target=self._watch_loop, name="gputop-demo-watch",
                                           daemon=True)
            self._watch.start()
        pids = {i: [p.pid] for i, p in self.procs.items()}
        pids.update({i: [p.pid for p in procs] for i, procs in self.mig_procs.items()})
        return pids

    def failures(self) -> list[str]:
        """One line for each stand-in that has ended since the last call (and not stopped by
        us): which GPU's, how, and the last line of its stderr."""
        lines = []
        for index, proc in self.procs.items():
            code = proc.poll()
            if code is None or index in self._told or self._stopping.is_set():
                continue
            self._told.add(index)
            how = (f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
            why = _last_line(self._stderr[index]) if index in self._stderr else ""
            command = " ".join(proc.args[1:3]) if isinstance(proc.args, list) else "?"
            lines.append(f"demo: the stand-in of GPU {index} (python {command}) {how}"
                         + (f": {why}" if why else ""))
        return lines

    def _watch_loop(self) -> None:
        while not self._stopping.wait(WATCH_S):
            for line in self.failures():
                if self.on_failure is not None and not self._stopping.is_set():
                    self.on_failure(line)

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.join(timeout)
            self._watch = None
        every = [*self.procs.values(), *(p for ps in self.mig_procs.values() for p in ps)]
        for proc in every:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        for proc in every:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        self.mig_procs.clear()
        for err in self._stderr.values():
            err.close()
        self._stderr.clear()

    def __enter__(self) -> StandIns:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_ready(standins: StandIns, timeout: float = 10.0) -> bool:
    """Wait until every stand-in has forked its workers (so the first sample shows them).

    One pass over /proc per poll for all the stand-ins (psutil's ``children()`` makes one per
    process)."""
    from gputop.collect.host import _ppid_map

    want = {proc.pid: n for i, proc in standins.procs.items()
            if (n := forked_workers(standins.scenario, i, standins.trainer))}
    procs = {p.pid: p for p in standins.procs.values()}
    deadline = time.monotonic() + timeout
    while want:
        # A stand-in that ended will fork no workers: do not wait the whole timeout for it.
        want = {pid: n for pid, n in want.items() if procs[pid].poll() is None}
        children: dict[int, int] = {}
        for parent in _ppid_map().values():
            children[parent] = children.get(parent, 0) + 1
        if all(children.get(pid, 0) >= n for pid, n in want.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
