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
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from gputop.agent.children import in_dataloader_worker, is_multiprocessing_child

if TYPE_CHECKING:
    from gputop.agent.process import Agent

__all__ = ["install", "shutdown", "socket_path", "is_multiprocessing_child"]

_install_lock = threading.Lock()
_agent: Agent | None = None


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
            # The controllers load here, on first use: importing gputop.agent costs nothing.
            from gputop.agent.process import Agent
            from gputop.agent.torch_hooks import after_import

            agent = Agent()
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
    if in_dataloader_worker():
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
