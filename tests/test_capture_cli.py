"""`gputop capture` end to end: the acceptance flow and its failures, through the real CLI."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SLOW, run_cli, wait_for
from tests.scripts.agent_testkit import (
    ANSWER_S,
    INFERENCE,
    gputop_run,
    private_agent_world,
    running,
    train_cmd,
    wait_for_steps,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    captures = tmp_path_factory.mktemp("captures")
    with private_agent_world(captures) as (env, _):
        yield env, captures


def test_acceptance_run_then_capture_json_and_report(world, tmp_path):
    env, captures = world
    # T.py: a small CPU training loop with a slow DataLoader; 300 steps of ~30 ms, exit code 3.
    job = gputop_run(train_cmd("--steps", "300", "--item-ms", "3", "--exit-code", "3"), env)
    with running(job):
        wait_for_steps(job.pid, steps=2)
        # (How long a capture takes is measured by benchmarks/bench_capture.py.)
        result = run_cli("capture", str(job.pid), "--steps", "3", "--json", env=env)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        trace = Path(report["trace"])
        assert trace.parent == captures and trace.exists()
        assert stat.S_IMODE(trace.stat().st_mode) == 0o600
        assert "dataloader-stall" in [f["id"] for f in report["findings"]]
        assert report["verdict"] == "dataloader-stall"
        # The human report, into --out this time.
        out = tmp_path / "traces"
        human = run_cli("capture", str(job.pid), "--out", str(out), env=env)
        assert human.returncode == 0, human.stderr
        assert "dataloader-stall" in human.stdout
        traces = list(out.iterdir())
        assert len(traces) == 1 and f"trace: {traces[0]}" in human.stdout
        assert "Traceback" not in human.stderr + result.stderr
        # The job runs to completion with its own exit code.
        assert job.wait(SLOW) == 3
        assert "finished" in job.stdout.read()


def test_process_exiting_mid_capture_keeps_what_was_recorded(world):
    env, _ = world
    job = gputop_run(train_cmd("--steps", "30", "--item-ms", "3"), env)
    with running(job):
        wait_for_steps(job.pid, steps=2)
        # The job ends long before 500 steps and before the capture's timeout: the steps it
        # recorded are saved and analysed, and a warning says the trace is partial (a capture
        # that waited for its timeout would fail instead).
        result = run_cli("capture", str(job.pid), "--steps", "500", "--timeout", str(int(SLOW)),
                         "--json", env=env, timeout=2 * SLOW)
        assert result.returncode == 0, result.stderr
        warning = [line for line in result.stderr.splitlines() if "warning" in line]
        assert warning and "partial trace: the process exited after" in warning[0]
        assert "of 500 recorded steps" in warning[0]
        data = json.loads(result.stdout)
        assert data["metrics"]["steps"]["count"] >= 1 and os.path.isfile(data["file"])
        assert job.wait(SLOW) == 0


def test_no_steps_gets_a_time_window_with_a_note(world):
    env, _ = world
    job = gputop_run([sys.executable, str(INFERENCE)], env)
    with running(job):
        from gputop.client import agents as client

        wait_for(lambda: (client.agent_status(job.pid, timeout=ANSWER_S) or {}).get("step_hook"),
                 timeout=SLOW)
        # No optimizer step comes: not a failure, a time window of all threads, said so.
        result = run_cli("capture", str(job.pid), "--timeout", "2", "--json", env=env)
        assert result.returncode == 0, result.stderr
        warning = [line for line in result.stderr.splitlines() if "warning" in line]
        assert warning and "no optimizer step in" in warning[0]
        assert "time window of all threads instead" in warning[0]
        assert json.loads(result.stdout)["capture"]["mode"] == "seconds"
        window = run_cli("capture", str(job.pid), "--seconds", "0.5", "--json", env=env)
        assert window.returncode == 0, window.stderr
        report = json.loads(window.stdout)
        assert report["metrics"]
        with gzip.open(report["trace"], "rt") as f:
            names = {e.get("name") for e in json.load(f)["traceEvents"]}
        # The main thread's forward passes, recorded by a profiler started on another thread.
        assert "aten::linear" in names


def _one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("gputop: error:")
    return lines[-1]


def test_bad_input_is_a_one_line_error(world, spawn):
    env, _ = world
    gone = spawn([sys.executable, "-c", "pass"])
    gone.wait(SLOW)
    assert f"no process with pid {gone.pid}" in _one_line_error(
        run_cli("capture", str(gone.pid), env=env), 1
    )
    bystander = spawn(["sleep", "600"], cwd=REPO)
    line = _one_line_error(run_cli("capture", str(bystander.pid), env=env), 1)
    assert "has no gputop agent" in line and "gputop run" in line
    assert "process id" in _one_line_error(run_cli("capture", "abc", env=env), 2)
    assert "--steps" in _one_line_error(run_cli("capture", "1", "--steps", "0", env=env), 2)
    assert "--timeout" in _one_line_error(run_cli("capture", "1", "--timeout", "0", env=env), 2)
    both = run_cli("capture", "1", "--steps", "2", "--seconds", "1", env=env)
    assert both.returncode == 2 and "not allowed with" in both.stderr
