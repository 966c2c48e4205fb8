"""The gputop agent, loaded inside a training process.

``import gputop.agent; gputop.agent.install()`` (or ``gputop run -- CMD``, which does it in every
Python process of the job) starts a private Unix socket server on a daemon thread and, once the
program imports torch, a global optimizer step post-hook and a DataLoader ``__next__`` timer.
Idle, it costs one short Python call per optimizer step and two clock reads per batch (about
a microsecond per step; see benchmarks/bench_agent.py). It never
imports torch itself, never raises into the training thread, and stays out of DataLoader
workers: a forked child drops the parent's server, and a multiprocessing child (spawned or
forked) only starts serving if it steps an optimizer itself, which workers never do.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gputop.agent import flight_recorder
from gputop.agent.flops import FlopCount
from gputop.agent.goodput import GoodputLedger, wrap_torch_save
from gputop.agent.info import distributed_info, hello
from gputop.agent.memory import MemoryCapture
from gputop.agent.oom import OomWatch
from gputop.agent.pidinfo import PidInfo
from gputop.agent.profiling import CaptureController
from gputop.agent.server import AgentServer
from gputop.agent.telemetry import StepTelemetry
from gputop.agent.torch_hooks import TorchHooks, after_import

__all__ = ["install", "shutdown", "socket_path", "is_multiprocessing_child"]

_install_lock = threading.Lock()
_agent: _Agent | None = None


def is_multiprocessing_child() -> bool:
    """A process started by multiprocessing (spawn, forkserver) or a fork of one."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    if "--multiprocessing-fork" in argv:
        return True
    # multiprocessing's helpers: the resource tracker and the forkserver.
    if "-c" in argv[:-1] and argv[argv.index("-c") + 1].startswith("from multiprocessing."):
        return True
    mp = sys.modules.get("multiprocessing")
    try:
        return mp is not None and mp.parent_process() is not None
    except Exception:
        return False


def _in_dataloader_worker() -> bool:
    if "torch" not in sys.modules:
        return False
    try:
        from torch.utils.data import get_worker_info

        return get_worker_info() is not None
    except Exception:
        return False


class _Agent:
    def __init__(self) -> None:
        self.started_at = time.time()
        self.pid = os.getpid()
        self.telemetry = StepTelemetry()
        self.hooks = TorchHooks(self.telemetry)
        self.capture = CaptureController(self.telemetry, self.hooks.ensure_placed)
        self.memory = MemoryCapture(self.telemetry, self.hooks.ensure_placed, self.capture,
                                    self.started_at)
        self.capture.busy_elsewhere = self.memory.busy  # one capture of either kind at a time
        self.oom = OomWatch(self.telemetry, self.memory, self.started_at)
        self.telemetry.ledger = GoodputLedger(capture=self.capture)
        self.flops = FlopCount(self.telemetry, self.hooks.ensure_placed, self._capturing)
        self._unwrap_save = lambda: None
        self.server: AgentServer | None = None
        self.server_error: str | None = None
        self.pids = PidInfo()  # its pid namespace and host pid, in a container

    def _capturing(self) -> bool:
        return self.capture.job is not None or self.memory.job is not None

    def torch_imported(self, module: Any = None) -> None:
        """The program imported torch: place the hooks, time torch.save, arm the FLOP count."""
        self.hooks.place(module)
        if self.hooks.step_hook is None:
            return
        try:
            self.oom.torch_imported(sys.modules["torch"])
        except Exception as exc:
            self.telemetry.record_error(exc)
        try:
            telemetry = self.telemetry
            self._unwrap_save = wrap_torch_save(sys.modules["torch"], lambda: telemetry.ledger,
                                                lambda: telemetry.step_thread)
            self.flops.arm_auto()
        except Exception as exc:
            self.telemetry.record_error(exc)

    # --- lifecycle -----------------------------------------------------------------------------

    def serve(self) -> Path | None:
        """Start the socket server in this process (once). Never raises."""
        if self.server is not None:
            return self.server.path
        server = AgentServer(
            {
                "hello": lambda msg, gone: self._hello(msg),
                "status": lambda msg, gone: self._status(msg),
                "capture": self.capture.capture,
                "cancel": lambda msg, gone: self._cancel(msg),
                "seen": lambda msg, gone: self.pids.seen(msg),
                "flops": self.flops.request,
                "memory": self.memory.request,
                "fr_dump": lambda msg, gone: flight_recorder.request(
                    msg, distributed_info().get("rank")),  # type: ignore[arg-type]
            },
            on_error=self.telemetry.record_error,
        )
        try:
            path = server.start()
        except Exception as exc:
            self.server_error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        self.server = server
        self.server_error = None
        return path

    def wake_in_child(self) -> None:
        """First optimizer step of a dormant multiprocessing child: serve, unless a worker."""
        if _in_dataloader_worker():
            return  # stays disabled: DataLoader workers never get an agent
        self.telemetry.enabled = True
        self.serve()

    def after_fork_in_child(self) -> None:
        """Runs in every forked child: the parent's server is not ours to keep."""
        self.pid = os.getpid()
        if self.server is not None:
            self.server.forget_after_fork()
            self.server = None
        self.capture._lock = threading.Lock()  # may have been held by a thread that is gone
        self.capture.job = None
        self.capture.last = None
        self.memory.leave_after_fork()
        self.memory = MemoryCapture(self.telemetry, self.hooks.ensure_placed, self.capture,
                                    self.started_at)
        self.capture.busy_elsewhere = self.memory.busy
        self.oom.memory = self.memory
        self.oom.reports, self.oom.last = 0, None
        self.telemetry.reset()
        self.telemetry.enabled = False
        self.telemetry.on_first_step = self.wake_in_child
        # The child's own time and steps: its start is its fork, its count its own.
        self.flops.leave_after_fork()
        self.telemetry.ledger = GoodputLedger(capture=self.capture)
        self.telemetry.on_boundary = None
        self.flops = FlopCount(self.telemetry, self.hooks.ensure_placed, self._capturing)
        self.flops.arm_auto()

    def at_exit(self) -> None:
        if os.getpid() != self.pid:
            return
        try:
            self.flops.abandon()
            self.capture.abandon_at_exit()
            self.memory.abandon()
        finally:
            if self.server is not None:
                self.server.close()

    # --- commands ------------------------------------------------------------------------------

    def _hello(self, message: dict[str, Any]) -> dict[str, Any]:
        if set(message) - {"cmd"}:
            return _bad_fields(message)
        return hello(self.started_at)

    def _status(self, message: dict[str, Any]) -> dict[str, Any]:
        if set(message) - {"cmd"}:
            return _bad_fields(message)
        problem = self.hooks.ensure_placed()
        reply: dict[str, Any] = {"ok": True, "pid": os.getpid()}
        reply.update(self.telemetry.status())
        reply.update(distributed_info())  # rank and job: the monitor groups ranks into jobs
        torch = sys.modules.get("torch")
        reply["torch_imported"] = torch is not None and not getattr(
            getattr(torch, "__spec__", None), "_initializing", False
        )
        reply["step_hook"] = problem is None
        if problem is not None:
            reply["step_hook_problem"] = problem
        # The capture running, of either kind (one at a time): the monitor's progress line.
        reply["capture"] = (self.memory.status() if self.memory.job is not None
                            else self.capture.status())
        reply["flops"] = self.flops.status()
        reply["goodput"] = self.telemetry.ledger.status()
        # What the live hang rule reads: Flight Recorder on or not, a torch.save in progress.
        reply["flight_recorder"] = flight_recorder.status()
        reply["checkpoint_s"] = self.telemetry.ledger.saving_for()
        reply["agent_errors"] = self.telemetry.errors
        if self.telemetry.last_error:
            reply["last_agent_error"] = self.telemetry.last_error
        reply["refused_peers"] = self.server.refused if self.server is not None else 0
        reply.update(self.pids.status())  # in a container: its pid namespace and host pid
        return reply

    def _cancel(self, message: dict[str, Any]) -> dict[str, Any]:
        if set(message) - {"cmd"}:
            return _bad_fields(message)
        return {"ok": True, "cancelled": self.capture.cancel() or self.memory.cancel()}


def _bad_fields(message: dict[str, Any]) -> dict[str, Any]:
    extra = sorted(repr(str(k)[:40]) for k in message if k != "cmd")
    return {
        "ok": False,
        "error": "bad-request",
        "message": f"unexpected field(s) for {message.get('cmd')}: {', '.join(extra)}",
    }


def install(dormant: bool | None = None) -> Path | None:
    """Load the agent in this process; safe to call more than once.

    Returns the socket path when the agent serves now, None when it waits: in a
    multiprocessing child (``dormant`` defaults to that) it starts serving at the first
    optimizer step, so DataLoader workers never get one. Never raises: a failure to start the
    server leaves training untouched (see ``gputop.agent.problem()``).
    """
    global _agent
    with _install_lock:
        if _agent is None:
            agent = _Agent()
            try:
                os.register_at_fork(after_in_child=agent.after_fork_in_child)
                atexit.register(agent.at_exit)
                agent.oom.install()  # out-of-memory errors that end the job: their report
                after_import("torch", agent.torch_imported)
            except Exception as exc:
                agent.telemetry.record_error(exc)
            _agent = agent
        agent = _agent
    if dormant is None:
        dormant = is_multiprocessing_child()
    if _in_dataloader_worker():
        agent.telemetry.enabled = False
        return None
    if dormant and agent.server is None:
        agent.telemetry.enabled = False
        agent.telemetry.on_first_step = agent.wake_in_child
        return None
    agent.telemetry.enabled = True
    agent.telemetry.on_first_step = None
    return agent.serve()


def socket_path() -> Path | None:
    """Where this process's agent listens, if it does."""
    agent = _agent
    return agent.server.path if agent is not None and agent.server is not None else None


def problem() -> str | None:
    """Why the agent is not serving, if it was asked to and could not."""
    agent = _agent
    return None if agent is None else agent.server_error


def shutdown() -> None:
    """Stop the server and remove every hook (for tests and benchmarks)."""
    global _agent
    with _install_lock:
        agent, _agent = _agent, None
    if agent is None:
        return
    agent.capture.cancel("cancelled", "the agent was shut down")
    agent.memory.abandon()
    agent.oom.uninstall()
    agent.flops.abandon()
    agent.telemetry.enabled = False
    agent.hooks.remove()
    agent._unwrap_save()
    if agent.server is not None:
        agent.server.close()
        agent.server = None
