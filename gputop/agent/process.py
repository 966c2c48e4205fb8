"""The agent of one training process: its controllers (telemetry, torch hooks, the trace,
memory and FLOP captures, the out-of-memory watch, the goodput ledger), its socket server and
the commands the server answers. Loaded by ``gputop.agent.install()`` on first use, never by
the monitor.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gputop.agent.children import in_dataloader_worker
from gputop.agent.flops import FlopCount
from gputop.agent.goodput import GoodputLedger, wrap_torch_save
from gputop.agent.info import distributed_info, hello
from gputop.agent.memory import MemoryCapture
from gputop.agent.oom import OomWatch
from gputop.agent.pidinfo import PidInfo
from gputop.agent.profiling import CaptureController
from gputop.agent.server import AgentServer
from gputop.agent.telemetry import StepTelemetry
from gputop.agent.torch_hooks import TorchHooks


class Agent:
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
        if in_dataloader_worker():
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
