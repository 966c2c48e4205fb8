"""Start and stop the demo's stand-in processes, one per simulated GPU."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection

from gputop.collect.scenarios import Scenario


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def standin_command(scenario: Scenario, index: int, parent: int,
                    origin: float | None = None) -> list[str]:
    """The command of GPU ``index``'s stand-in. In `input-starved` and `tour`, GPU 0 (an
    input-starved GPU) runs a real torch training loop with the agent (when torch is installed),
    so `p` captures real steps and the agent's FLOP count, steps and goodput give MFU and J/step
    against the simulated board; its DataLoader workers burn a core each and still cannot keep
    up, like the plain stand-in's. ``origin``: time.monotonic() when the simulated driver's
    clock started (a stand-in that takes turns with its GPU follows it)."""
    gpu = scenario.gpus[index]
    if index == 0 and gpu.kind == "input-starved" and torch_available():
        return [sys.executable, "-m", "gputop.demo.train", "--parent-pid", str(parent),
                "--num-workers", str(gpu.workers)]
    return [sys.executable, "-m", "gputop.demo.standin", gpu.standin,
            "--workers", str(gpu.workers), "--parent", str(parent),
            *(["--origin", repr(origin)] if origin is not None else [])]


def _launch(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C in gputop's terminal is not theirs
    )


class StandIns:
    """The real processes behind a scenario's GPUs. Use as a context manager."""

    def __init__(self, scenario: Scenario, origin: float | None = None) -> None:
        self.scenario = scenario
        self.origin = origin  # the simulated driver's clock start (time.monotonic)
        self.procs: dict[int, subprocess.Popen] = {}
        self.mig_procs: dict[int, list[subprocess.Popen]] = {}  # per MIG device, in order

    def start(self, skip: Collection[int] = ()) -> dict[int, list[int]]:
        """Launch one stand-in per GPU (but those in ``skip``); return {gpu index: [pid]}."""
        me = os.getpid()
        for index, gpu in enumerate(self.scenario.gpus):
            if index in skip:
                continue  # a real process of the user's stands there (GPUTOP_DEMO_PIDS)
            if gpu.mig:  # MIG: a stand-in per MIG device that runs work
                self.mig_procs[index] = [
                    _launch([sys.executable, "-m", "gputop.demo.standin", piece.standin,
                             "--parent", str(me)])
                    for piece in gpu.mig if piece.standin is not None]
                continue
            self.procs[index] = _launch(standin_command(self.scenario, index, me, self.origin))
        pids = {i: [p.pid] for i, p in self.procs.items()}
        pids.update({i: [p.pid for p in procs] for i, procs in self.mig_procs.items()})
        return pids

    def stop(self, timeout: float = 2.0) -> None:
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

    def __enter__(self) -> StandIns:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_ready(standins: StandIns, timeout: float = 10.0) -> bool:
    """Wait until every stand-in has forked its workers (so the first sample shows them).

    One pass over /proc per poll for all the stand-ins (psutil's ``children()`` makes one per
    process)."""
    from gputop.collect.host import _ppid_map

    want = {standins.procs[i].pid: gpu.workers for i, gpu in enumerate(standins.scenario.gpus)
            if i in standins.procs and gpu.workers}
    deadline = time.monotonic() + timeout
    while want:
        children: dict[int, int] = {}
        for parent in _ppid_map().values():
            children[parent] = children.get(parent, 0) + 1
        if all(children.get(pid, 0) >= n for pid, n in want.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
