"""`gputop report` measures the job that drives the GPUs, names it, and keeps one metrics file per
recording; the CLI's small edges (`--gpus` out of range, a reader that leaves a pipe)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env, run_cli


@pytest.fixture
def cpu_job_with_agent(steady_agent_job):
    """A CPU-only training job with the agent on the same host: fast steps, no DataLoader."""
    return steady_agent_job


@pytest.mark.timeout(400)
def test_report_takes_the_gpu_job_not_a_cpu_job_with_an_agent(tmp_path, cpu_job_with_agent):
    pytest.importorskip("torch")  # the input-starved demo's GPU 0 is a real torch trainer
    first = tmp_path / "r"
    rec = run_cli("--demo", "input-starved", "record", "-o", str(first), "--duration", "45",
                  "--flush-every", "5", timeout=300)
    assert rec.returncode == 0, rec.stderr
    done = run_cli("report", str(first), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    metrics = summary["metrics"]
    job = metrics["job"]
    assert job is not None and job["gpus"] == [0] and "gputop.demo.train" in job["command"]
    gpu0 = [p for p in summary["processes"] if p["pid"] == job["pid"]][0]
    assert metrics["throughput_steps_per_s"] == gpu0["throughput_steps_per_s"]
    assert metrics["dataloader_wait_share"] > 0.5  # the starved job, not the CPU job's 0 %
    # The CPU job on the same host is not the recording's business: it is neither a job of
    # the report nor a row of its table.
    assert [j["pid"] for j in summary["jobs"]] == [job["pid"]]
    assert cpu_job_with_agent.pid not in [p["pid"] for p in summary["processes"]]
    assert all(p["gpus"] for p in summary["processes"])

    # The metrics file is named after the recording, beside it, and says which job it measured.
    written = json.loads((tmp_path / "r.metrics.json").read_text())
    assert written["job"]["pid"] == job["pid"]
    text = run_cli("report", str(first))
    assert f"training job: pid {job['pid']} on GPU 0" in text.stdout
    assert str(cpu_job_with_agent.pid) not in text.stdout and "steady_train" not in text.stdout
    metrics_line = [ln for ln in text.stdout.splitlines() if ln.startswith("metrics: ")][0]
    assert "peak GPU memory" in metrics_line and "steps/s" in metrics_line
    assert not re.search(r"\d\.\d{4,}|e\+\d", metrics_line)  # units, not raw floats

    # A second recording in the same folder leaves the first one's metrics alone.
    before = (tmp_path / "r.metrics.json").read_bytes()
    second = tmp_path / "r2"
    assert run_cli("--demo", "no-driver", "record", "-o", str(second), "--duration", "3",
                   "--flush-every", "1").returncode == 0
    assert run_cli("report", str(second), "--json").returncode == 0
    assert (tmp_path / "r.metrics.json").read_bytes() == before
    # No GPU recorded (no driver): the job with an agent on the host is the recording's job.
    assert json.loads((tmp_path / "r2.metrics.json").read_text())["job"]["pid"] == \
        cpu_job_with_agent.pid


def test_a_tour_recording_never_names_an_unrelated_cpu_process(tmp_path, cpu_job_with_agent):
    """A CPU-only python process with an agent runs beside the tour: the report names the
    tour's own training job (GPU 0's torch trainer) or none, never that process, and lists no
    row of it (the GPUs' energy is not divided by its steps)."""
    rec = tmp_path / "tour"
    done = run_cli("--demo", "tour", "record", "-o", str(rec), "--duration", "4",
                   "--flush-every", "1")
    assert done.returncode == 0, done.stderr
    summary = json.loads(run_cli("report", str(rec), "--json").stdout)
    job = summary["metrics"]["job"]
    assert job is None or (job["gpus"] and job["pid"] != cpu_job_with_agent.pid), job
    if job is None:
        assert summary["metrics"]["energy_per_step_j"] is None
    assert summary["metrics"]["energy_j"] > 0  # the GPUs are there
    assert summary["processes"] and all(p["gpus"] for p in summary["processes"])
    text = run_cli("report", str(rec)).stdout
    assert str(cpu_job_with_agent.pid) not in text and "steady_train" not in text


@pytest.fixture(scope="module")
def small_recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "small"
    rec = run_cli("--demo", "tour", "record", "-o", str(out), "--duration", "3",
                  "--flush-every", "1")
    assert rec.returncode == 0, rec.stderr
    return out


def test_unwritable_metrics_still_prints_the_report(small_recording):
    done = run_cli("report", str(small_recording), "--metrics", "/proc/gputop-no/m.json")
    assert "UTIL mean/p5/p50/p95" in done.stdout  # the report came first
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write /proc/gputop-no/m.json" in lines[0]


def test_a_reader_that_leaves_the_pipe_is_not_an_error(small_recording):
    proc = subprocess.Popen([sys.executable, "-m", "gputop", "report", str(small_recording),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=cli_env(), cwd=REPO)
    try:
        proc.stdout.close()  # like `| head -1` that has read its line and left
        err = proc.stderr.read().decode()
        assert proc.wait(120) == 0, err
        assert err == ""
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("args", [["--gpus", "99", "snapshot"],
                                  ["--demo", "tour", "--gpus", "1,99", "snapshot"],
                                  ["--demo", "tour", "snapshot", "--gpus", "10"]])
def test_gpus_that_do_not_exist_are_one_line_and_exit_2(args):
    done = run_cli(*args)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputop: error: --gpus") and not done.stdout


def test_gpus_that_exist_still_work():
    done = run_cli("--demo", "tour", "--gpus", "7", "snapshot", "--json")
    assert done.returncode == 0, done.stderr
    assert [g["index"] for g in json.loads(done.stdout)["gpus"]] == [7]
