"""Helpers shared by the agent tests: a private socket/capture environment and real jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import REPO, SLOW, cli_env, end_popen, wait_for

SCRIPTS = Path(__file__).resolve().parent
TRAIN = SCRIPTS / "slow_loader_train.py"
INFERENCE = SCRIPTS / "inference_loop.py"

# How long one request may take to be answered by the agent of a busy job on a loaded machine
# (the agent answers from a thread of a process that is training flat out).
ANSWER_S = 10.0


def private_runtime_dir() -> Path:
    """A fresh XDG_RUNTIME_DIR (0700): the agents of one test module live only there."""
    path = Path(tempfile.mkdtemp(prefix="gputop-test-xdg-"))
    os.chmod(path, 0o700)
    return path


@contextmanager
def private_agent_world(captures: Path, **extra: str) -> Iterator[tuple[dict[str, str], Path]]:
    """A private socket dir and capture dir, set for this process too (the client reads them), and the
    job environment that uses them; both are restored and the socket dir removed afterwards."""
    runtime = private_runtime_dir()
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "GPUTOP_CAPTURE_DIR")}
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    os.environ["GPUTOP_CAPTURE_DIR"] = str(captures)
    try:
        yield agent_env(runtime, captures, **extra), runtime
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(runtime, ignore_errors=True)


def agent_env(runtime: Path, captures: Path, **extra: str) -> dict[str, str]:
    env = cli_env(
        XDG_RUNTIME_DIR=str(runtime),
        GPUTOP_CAPTURE_DIR=str(captures),
        XDG_STATE_HOME=str(captures.parent / "state"),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def gputop_run(job: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    """``python -m gputop run -- JOB`` (exec: the Popen pid is the job's pid)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gputop", "run", "--", *job],
        env=env,
        cwd=REPO,
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=kw.pop("stderr", subprocess.PIPE),
        text=True,
        **kw,
    )


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, str(TRAIN), *args]


@contextmanager
def running(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Make sure a job, and every process it started (DataLoader workers, torchrun's ranks),
    never outlives its test or fixture, pass or fail."""
    try:
        yield proc
    finally:
        end_popen(proc)


def wait_for_steps(pid: int, steps: int = 2, timeout: float = SLOW) -> dict:
    """Poll the agent's status until it has counted ``steps`` optimizer steps."""
    from gputop.client.agents import agent_status

    def ready() -> dict | None:
        status = agent_status(pid, timeout=ANSWER_S)
        return status if status and (status.get("steps") or 0) >= steps else None

    return wait_for(ready, timeout=timeout, interval=0.1)


def status_of(pid: int, timeout: float = SLOW) -> dict:
    """The agent's status, asked again until it answers (a loaded machine can delay one)."""
    from gputop.client.agents import agent_status

    return wait_for(lambda: agent_status(pid, timeout=ANSWER_S), timeout=timeout, interval=0.1)


def wait_for_more_steps(pid: int, more: int = 3, timeout: float = SLOW) -> dict:
    """Wait until the job has taken ``more`` optimizer steps from now: training goes on."""
    from gputop.client.agents import agent_status

    steps = status_of(pid)["steps"]

    def ahead() -> dict | None:
        status = agent_status(pid, timeout=ANSWER_S)
        return status if status and status["steps"] >= steps + more else None

    return wait_for(ahead, timeout=timeout, interval=0.1)
