"""The training job's own stderr is the user's (issue 38, acceptance 4): after `gputop capture
PID` and `gputop memory PID` on a real job, its stderr holds no line from gputop or the
profiler (Kineto's ``USDT: ... profiler_start`` / ``profiler_stop``, c10's CPUAllocator
warning), and what the job writes itself meanwhile still gets there, in order."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from gputop.client import agents as client
from tests.conftest import REPO, SLOW, cli_env, run_cli, wait_for

FILTER_SCRIPT = textwrap.dedent("""
    import os, sys
    from gputop.agent import quiet
    quiet.begin()
    os.write(2, b"USDT:2026-11-27 22:29:16 1055:1055 SyncActivityProfilerHandler.cpp:52]"
                b" profiler_start\\n")
    os.write(2, b"job line 1\\n")
    print("job line 2", file=sys.stderr, flush=True)
    os.write(2, b"[W1127 22:30:18.436507245 CPUAllocator.cpp:245] Memory block of unknown"
                b" size was allocated before the profiling started\\n")
    os.write(2, b"US")  # the start of a line that is not the profiler's after all
    os.write(2, b"ER: job line 3\\n[WARN] job line 4\\n")
    quiet.end()
    os.write(2, b"job line 5\\n")
""")


def test_the_filter_drops_the_profilers_lines_and_nothing_else():
    done = subprocess.run([sys.executable, "-c", FILTER_SCRIPT], capture_output=True,
                          env=cli_env(), cwd=REPO, timeout=SLOW)
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().splitlines() == [
        "job line 1", "job line 2", "USER: job line 3", "[WARN] job line 4", "job line 5"]


def test_capture_and_memory_leave_the_jobs_stderr_alone(tmp_path, spawn):
    train = str(REPO / "tests" / "scripts" / "steady_train.py")
    err_path = tmp_path / "job.stderr"
    with open(err_path, "wb") as err:
        job = spawn([sys.executable, "-m", "gputop", "run", "--", sys.executable, train,
                     "--seconds", "600", "--step-ms", "20"],
                    env=cli_env(OMP_NUM_THREADS="1", GPUTOP_CAPTURE_DIR=str(tmp_path)),
                    cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
    assert job.stdout.readline().strip() == "training"
    wait_for(lambda: client.find_agent(job.pid), timeout=SLOW)
    before = err_path.read_bytes()
    captured = run_cli("capture", str(job.pid), "--steps", "2", "--out", str(tmp_path))
    assert captured.returncode == 0, captured.stderr
    memory = run_cli("memory", str(job.pid), "--steps", "2")
    assert memory.returncode == 0, memory.stderr
    assert job.poll() is None
    added = err_path.read_bytes()[len(before):].decode(errors="replace")
    assert not any(word in added for word in ("USDT", "profiler_st", "CPUAllocator", "gputop")), \
        added
