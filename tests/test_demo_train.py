"""`python -m gputop.demo.train`: the demo's real training process, and how it ends."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from gputop.client import agents as client
from tests.conftest import REPO, wait_for
from tests.scripts.agent_testkit import agent_env, private_runtime_dir, wait_for_steps


@pytest.fixture
def env(tmp_path, monkeypatch):
    runtime = private_runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("GPUTOP_SOCKET_DIR", str(runtime / "gputop"))  # where its agent listens
    yield agent_env(runtime, tmp_path / "captures")
    shutil.rmtree(runtime, ignore_errors=True)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_demo_train_is_input_starved_and_dies_with_its_parent(env):
    # A parent that starts the demo process and then is killed without a chance to clean up.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
            import subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-m", "gputop.demo.train",
                                      "--transform-passes", "8"])
            print(child.pid, flush=True)
            time.sleep(120)
            """
            ),
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    try:
        status = wait_for_steps(child, steps=4)
        assert status["dataloader_wait_share"] > 0.5
        assert os.path.basename(client.request(child, {"cmd": "hello"})["argv"][0]) == "train.py"
        parent.send_signal(signal.SIGKILL)
        parent.wait(120)
        wait_for(lambda: gone(child), timeout=120)
    finally:
        for pid in (parent.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait(120)
