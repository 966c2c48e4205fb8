"""`gputop capture`'s messages (issue 38): a wrong PID is one line; Ctrl-C during a capture says
what was stopped and that the job is unharmed, and the job goes on stepping."""

from __future__ import annotations

import signal
import subprocess
import sys

from gputop.client import agents as client
from tests.conftest import REPO, SLOW, cli_env, end_popen, run_cli, wait_for


def test_a_wrong_pid_is_one_line(spawn):
    gone = spawn([sys.executable, "-c", "pass"])
    gone.wait(SLOW)
    done = run_cli("capture", str(gone.pid))
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "capturing" not in done.stderr


def test_ctrl_c_says_what_stopped_and_the_job_goes_on(steady_agent_job):
    job = steady_agent_job
    wait_for(lambda: client.find_agent(job.pid), timeout=SLOW)
    cap = subprocess.Popen([sys.executable, "-m", "gputop", "capture", str(job.pid), "--steps",
                            "1000", "--timeout", "600"], stderr=subprocess.PIPE, text=True,
                           env=cli_env(), cwd=REPO)
    try:
        assert "capturing pid" in cap.stderr.readline()  # the agent answered: it is on
        cap.send_signal(signal.SIGINT)
        assert cap.wait(SLOW) == 130
        said = cap.stderr.read().strip().splitlines()
        assert len(said) == 1 and "stopped (Ctrl-C)" in said[0] and "unharmed" in said[0], said
    finally:
        end_popen(cap)
    # The job steps on.
    steps = client.agent_status(job.pid, timeout=10)["steps"]
    wait_for(lambda: client.agent_status(job.pid, timeout=10)["steps"] > steps, timeout=SLOW)
    assert job.poll() is None
