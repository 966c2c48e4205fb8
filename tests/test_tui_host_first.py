"""The monitor on a shared node: this host's GPUs first. `gputop --demo memory-leak` in tmux at
120x40 while another user (uid 65534, a real process) trains on the CPU under `gputop run`: the
first finding shown is the GPU's `memory-growth`, and the other user's CPU job has no row in the
table until `a` asks for every process with an agent."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from tests.conftest import REPO, SLOW, cli_env, end_popen, wait_for
from tests.test_tui_readable import panel_text
from tests.test_tui_terminal import start, terminal

__all__ = ["terminal"]  # the fixture, used by name
pytestmark = [pytest.mark.timeout(8 * SLOW),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")]

NOBODY = 65534


@pytest.fixture
def unscoped(monkeypatch):
    """Another user's agent listens in that user's own directory: found by the default
    discovery, not in the tests' socket scope (conftest)."""
    monkeypatch.delenv("GPUTOP_SOCKET_DIR", raising=False)


@pytest.fixture
def foreign_cpu_job(unscoped):
    """A CPU training job of uid 65534 under `gputop run` with the agent, on no GPU
    (tests/scripts/foreign_train.py: it becomes that user, then loads the agent)."""
    train = str(REPO / "tests" / "scripts" / "foreign_train.py")
    env = cli_env(OMP_NUM_THREADS="1", GPUTOP_AGENT="0")
    env.pop("GPUTOP_SOCKET_DIR", None)
    job = subprocess.Popen([sys.executable, "-m", "gputop", "run", "--", sys.executable, train,
                            "--uid", str(NOBODY)], env=env, cwd="/", stdout=subprocess.PIPE,
                           text=True)
    try:
        assert job.stdout.readline().strip() == "training"
        assert psutil.Process(job.pid).uids().real == NOBODY
        yield job
    finally:
        end_popen(job)


def table_pids(screen: str) -> set[int]:
    """The PID column of the process table's rows (GPU, PID, USER ... COMMAND)."""
    pids = set()
    for line in screen.splitlines():
        words = line.replace("›", " ").replace("*", " ").split()
        if len(words) > 3 and (words[0].isdigit() or words[0] == "-") and words[1].isdigit():
            pids.add(int(words[1]))
    return pids


def test_memory_leak_demo_ranks_its_gpu_first_and_hides_the_foreign_cpu_job(
        terminal, foreign_cpu_job):
    term = terminal(120, 40)
    start(term, "--demo memory-leak")

    def first_finding() -> str | None:
        screen = term.capture()
        if "─ findings" not in screen:
            return None
        lines = [line.strip() for line in panel_text(screen, "─ findings")]
        return lines[0] if lines and "memory-growth" in screen else None

    first = wait_for(first_finding, timeout=4 * SLOW, interval=0.5)
    assert "memory-growth" in first, term.capture()
    screen = term.capture()
    assert foreign_cpu_job.pid not in table_pids(screen), screen
    assert "nobody" not in screen.split("─ findings")[0]
    # The job was there to be seen: `a` shows every process with an agent, its row included.
    term.keys("a")
    wait_for(lambda: foreign_cpu_job.pid in table_pids(term.capture()), timeout=2 * SLOW,
             interval=0.3)
    term.keys("a")
    wait_for(lambda: foreign_cpu_job.pid not in table_pids(term.capture()), timeout=SLOW,
             interval=0.3)
    # Still the first finding: the foreign job's own findings (if any) rank below the GPU's.
    assert "memory-growth" in first_finding()
