"""`gputop record` and `gputop report`: Parquet parts, crash safety, summaries, baseline gate."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gputop.client.agents import agent_status
from tests.conftest import REPO, SLOW, cli_env, run_cli, wait_for

TRAIN = str(REPO / "tests" / "scripts" / "steady_train.py")


def test_demo_recording_report_json_and_html(tmp_path):
    out = tmp_path / "run.parquet"
    rec = run_cli("--demo", "tour", "record", "-o", str(out), "--duration", "12",
                  "--flush-every", "4")
    assert rec.returncode == 0, rec.stderr
    frame = pd.read_parquet(out)  # plain pandas: one row per GPU per sample
    assert frame.groupby("time").size().unique().tolist() == [10]
    assert {"gpu", "util_gpu", "mem_used", "power_w", "clock_events"} <= set(frame.columns)
    assert len(list(out.glob("part-*.parquet"))) >= 2  # flushed in parts

    report = run_cli("report", str(out), "--html", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "UTIL mean/p5/p50/p95" in text and "NVIDIA H100 80GB HBM3" in text
    # GPU-side findings of the tour (they do not depend on how busy this machine's CPUs are).
    assert "findings timeline" in text and "pcie-bound" in text
    assert "utilization (0-100 %)" in text and "█" in text
    assert "sw_power_cap" in text  # time throttled, and why
    page = (tmp_path / "r.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "<script" not in page
    # `--html` alone: the page is named after the recording, beside it, and said where.
    again = run_cli("report", str(out), "--html")
    assert again.returncode == 0, again.stderr
    assert f"HTML report written to {tmp_path / 'run.parquet.html'}" in again.stderr
    assert (tmp_path / "run.parquet.html").read_text() == page

    data = json.loads(run_cli("report", str(out), "--json").stdout)
    gpus = {g["gpu"]: g for g in data["gpus"]}
    assert len(gpus) == 10 and gpus[2]["throttled_by"]["sw_power_cap"] > 0
    assert gpus[2]["energy_kwh"] > 0 and gpus[0]["util_p95"] >= gpus[0]["util_p5"]
    # The same numbers as the text report.
    assert f"{gpus[2]['util_mean']:.0f}/" in text
    metrics = json.loads((tmp_path / "run.parquet.metrics.json").read_text())
    assert metrics["mean_gpu_utilization"] == data["metrics"]["mean_gpu_utilization"]
    assert metrics["environment"]["gpu_models"] and metrics["environment"]["gputop_version"]


def test_killed_recorder_leaves_a_readable_recording(tmp_path):
    out = tmp_path / "killed.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "gputop", "--demo", "healthy", "record", "-o",
                             str(out), "--flush-every", "1"], env=cli_env(), cwd=REPO,
                            stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(list(out.glob("part-*.parquet"))) >= 4, timeout=120, interval=0.2)
    finally:
        proc.send_signal(signal.SIGKILL)  # its demo stand-ins end with it (PDEATHSIG)
        proc.wait()
    frame = pd.read_parquet(out)
    assert frame["time"].max() - frame["time"].min() >= 3
    assert not list(out.glob("*.tmp"))  # nothing visible is half-written
    report = run_cli("report", str(out))
    assert report.returncode == 0 and "[0]" in report.stdout


def test_recording_errors_are_one_line(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    for target, code in ((tmp_path / "taken", 1), (Path("/proc/gputop-cannot/run.parquet"), 1)):
        result = run_cli("--demo", "healthy", "record", "-o", str(target), "--duration", "2")
        assert result.returncode == code, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert (tmp_path / "taken" / "x").read_text() == "keep me"
    bad = run_cli("report", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def record_training(tmp_path: Path, name: str, slowdown: float) -> Path:
    """Record (real host, no GPU) a real training job started with `gputop run`."""
    # One intra-op thread: two torch threads on a busy 2-core machine wait for each other for
    # whole scheduler slices, which is what doubled the p95 step time of identical runs.
    job = subprocess.Popen([sys.executable, "-m", "gputop", "run", "--", sys.executable, TRAIN,
                            "--seconds", "60", "--step-ms", "100", "--slowdown", str(slowdown)],
                           env=cli_env(OMP_NUM_THREADS="1"), cwd=REPO, stdout=subprocess.PIPE,
                           text=True)
    try:
        assert job.stdout.readline().strip() == "training"
        # Past the first steps: the agent's count says so (not a guess of 2 s of wall time).
        wait_for(lambda: (agent_status(job.pid, timeout=10) or {}).get("steps", 0) >= 10,
                 timeout=SLOW)
        out = tmp_path / f"{name}.parquet"
        # ~26 step times of 5 steps each per run for the gate's distribution test.
        rec = run_cli("--interval", "0.5", "record", "-o", str(out), "--duration", "14",
                      "--flush-every", "5")
        assert rec.returncode == 0, rec.stderr
        return out
    finally:
        job.kill()  # `gputop run` execs the job: this pid is the training process itself
        job.wait(60)


@pytest.mark.timeout(720)  # three jobs, one after the other, each importing torch
def test_baseline_gate_on_real_training_runs(tmp_path):
    base = record_training(tmp_path, "base", 0.0)
    same = record_training(tmp_path, "same", 0.0)
    slow = record_training(tmp_path, "slow", 1.0)
    summary = json.loads(run_cli("report", str(base), "--json").stdout)
    trainer = [p for p in summary["processes"] if p["throughput_steps_per_s"]]
    assert trainer and trainer[0]["gpu"] is None  # a CPU job, found through its agent
    assert trainer[0]["step_time_p50_s"] > 0.09

    # The gate weighs each run's spread (Mann-Whitney U on the step times of every sample
    # interval): identical runs pass, the slow run's steps take twice as long.
    ok = run_cli("report", str(same), "--baseline", str(base), "--max-regression", "25%")
    assert ok.returncode == 0, ok.stderr
    assert "no regression" in ok.stderr
    regressed = run_cli("report", str(slow), "--baseline", str(base), "--max-regression", "25%")
    assert regressed.returncode == 1, regressed.stderr
    reason = regressed.stderr.strip().splitlines()
    assert len(reason) == 1 and "median step time" in reason[0] and "regression" in reason[0]
    assert "Mann-Whitney" in reason[0]
    # A metrics.json works as the baseline too.
    run_cli("report", str(base), "--metrics", str(tmp_path / "base-metrics.json"))
    again = run_cli("report", str(slow), "--baseline", str(tmp_path / "base-metrics.json"),
                    "--max-regression", "25%")
    assert again.returncode == 1
