"""Helpers shared by the agent tests: a private socket/capture environment and real jobs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import REPO, cli_env, wait_for

SCRIPTS = Path(__file__).resolve().parent
TRAIN = SCRIPTS / "slow_loader_train.py"
INFERENCE = SCRIPTS / "inference_loop.py"


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
    """Make sure a job never outlives its test."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        try:
            proc.communicate(timeout=30)
        except ValueError:
            pass  # the test already read the output


def wait_for_steps(pid: int, steps: int = 2, timeout: float = 60.0) -> dict:
    """Poll the agent's status until it has counted ``steps`` optimizer steps."""
    from gputop.agent.client import agent_status

    def ready() -> dict | None:
        status = agent_status(pid, timeout=1.0)
        return status if status and (status.get("steps") or 0) >= steps else None

    return wait_for(ready, timeout=timeout, interval=0.1)
