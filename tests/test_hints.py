"""What gputop says about a process it cannot capture, and about an agent before its first step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gputop.client.agents import no_agent_hint
from tests.conftest import REPO, cli_env, run_cli, wait_for


@pytest.fixture
def spawn():
    """Start real processes; every one is killed and reaped at teardown, pass or fail."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=cli_env(), cwd=REPO, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(60)


def test_a_demo_stand_in_is_not_sent_to_gputop_run(spawn):
    standin = spawn([sys.executable, "-m", "gputop.demo.standin", "idle",
                     "--parent", str(os.getpid())])
    wait_for(lambda: "gputop.demo.standin" in open(f"/proc/{standin.pid}/cmdline").read(),
             timeout=60)
    hint = no_agent_hint(standin.pid)
    assert "stand-in of the simulated demo" in hint and "--demo input-starved" in hint
    assert "gputop run" not in hint and "\n" not in hint


def test_a_real_process_without_agent_is_sent_to_gputop_run(spawn):
    sleeper = spawn(["sleep", "60"])
    assert "gputop run -- python train.py" in no_agent_hint(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    assert no_agent_hint(sleeper.pid) == f"no process with pid {sleeper.pid}"


def test_snapshot_says_n_a_before_the_first_step(spawn):
    job = spawn([sys.executable, "-c", "import gputop.agent, time; gputop.agent.install(); "
                 "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert job.stdout.readline().strip() == "ready"

    def agent_line() -> str | None:
        lines = run_cli("snapshot").stdout.splitlines()
        for row, following in zip(lines, lines[1:]):
            if str(job.pid) in row.split() and "agent:" in following:
                return following
        return None

    line = wait_for(agent_line, timeout=120, interval=0.5)
    assert "no optimizer step yet" in line and "n/a" in line
    assert "0 ms" not in line and "0%" not in line
