"""How efficient is a job (issue 30): the agent's FLOP count against the analytic count of a
known model, the goodput ledger's categories, MFU against the simulated board's datasheet peak
and its GPM cross-check, J/step from the energy counter, the report over a recording and its
MFU gate.

Real jobs (tests/scripts/flops_train.py under `gputop run`, the agent over its socket), the
simulated NVML for the GPUs they are put on (GPUTOP_DEMO_PIDS), real recordings."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gputop.client.agents import agent_status, request_flop_count
from gputop.core.peaks import peak_for
from gputop.sim.scenarios import STARTUP_S
from tests.conftest import (
    REPO,
    SLOW,
    TOUR_RECORD_S,
    Background,
    cli_env,
    end_popen,
    run_cli,
    wait_for,
)
from tests.scripts.agent_testkit import ANSWER_S, gputop_run, private_agent_world, running
from tests.test_tui_terminal import Tmux, end_processes, start, tmux_or_skip

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(6 * SLOW)

SCRIPT = REPO / "tests" / "scripts" / "flops_train.py"
DIMS = "64,256,128,10"
BATCH = 32


@pytest.fixture
def world(tmp_path):
    with private_agent_world(tmp_path / "captures") as (env, _runtime):
        env["OMP_NUM_THREADS"] = "1"
        yield env


def start_job(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, dict]:
    proc = gputop_run([sys.executable, str(SCRIPT), *args], env)
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.poll() is not None else "no output"
    return proc, json.loads(line)


def counted(pid: int) -> dict:
    """The agent's status once its automatic FLOP count (after warm-up) is in."""
    def ready():
        status = agent_status(pid, timeout=ANSWER_S)
        last = ((status or {}).get("flops") or {}).get("last")
        return status if last else None

    return wait_for(ready, timeout=2 * SLOW, interval=0.2)


def test_the_agent_counts_the_analytic_flops_of_a_known_model(world):
    """Acceptance 1: Linear layers cost 2·B·in·out forward, 2·B·in·out backward for the weight
    and 2·B·in·out for the input's gradient but the first layer's; within 5 %."""
    proc, job = start_job(world, "--dims", DIMS, "--batch", str(BATCH))
    with running(proc):
        status = counted(job["pid"])
        last = status["flops"]["last"]
        assert last["ok"] and last["trigger"] == "auto", last
        analytic = job["flops"]
        assert abs(last["flops_per_step"] - analytic) <= 0.05 * analytic, (last, analytic)
        assert last["precision"] == "fp32" and last["devices"] == ["cpu"]
        assert last["samples_per_step"] == BATCH
        assert last["step"] > 10  # after warm-up
        # Its cost is stated: the counted step against a typical one (their sizes are
        # benchmarks/bench_agent.py's to measure).
        assert isinstance(last["counted_step_s"], float) and last["cost_s"] is not None

        # On request (the monitor's `m`): the next step, counted again, the same FLOPs.
        reply = request_flop_count(job["pid"], timeout=SLOW)
        assert reply["trigger"] == "request" and reply["step"] > last["step"]
        assert abs(reply["flops_per_step"] - analytic) <= 0.05 * analytic
        # Training goes on after the counts: no mode left behind, steps advance.
        steps = agent_status(job["pid"], timeout=ANSWER_S)["steps"]
        wait_for(lambda: agent_status(job["pid"], timeout=ANSWER_S)["steps"] > steps + 5,
                 timeout=SLOW)
        assert agent_status(job["pid"], timeout=ANSWER_S)["agent_errors"] == 0


def test_flop_requests_are_checked(world):
    proc, job = start_job(world, "--dims", DIMS, "--batch", str(BATCH))
    with running(proc):
        from gputop.client.agents import request
        from gputop.core.protocol import AgentError

        for bad in ({"cmd": "flops", "timeout": "soon"}, {"cmd": "flops", "steps": 3},
                    {"cmd": "flops", "timeout": 1e9}):
            with pytest.raises(AgentError) as info:
                request(job["pid"], bad, timeout=ANSWER_S)
            assert info.value.code == "bad-request" and "\n" not in str(info.value)


def test_workers_forked_during_the_count_do_not_inherit_it(world):
    """The counted step starts an epoch whose DataLoader forks its worker: the child's thread
    would inherit the dispatch mode, and nothing would ever take it off there."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "scripts" /
                                               "fork_during_count.py")],
                          env=world, cwd=REPO, capture_output=True, text=True, timeout=SLOW)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["count"]["ok"] and result["count"]["step"] == 11
    assert result["batches"] == 24 and result["flagged"] == 0


def test_a_count_past_its_limit_leaves_without_a_next_step(world):
    """The counted step runs past the limit and the loop never steps again: counting stops,
    the mode is gone at the next module call, and the count says why."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "scripts" / "expired_count.py")],
                          env=world, cwd=REPO, capture_output=True, text=True, timeout=SLOW)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["under_mode"] == [True, False]
    assert result["state"] == "idle"
    assert result["count"]["ok"] is False and "time limit" in result["count"]["message"]
    assert "torch.compile" not in done.stderr  # no global module hook warning


def test_goodput_books_waits_checkpoints_file_writes_and_stalls(world, tmp_path):
    """Every category of the ledger from a job that does each: the DataLoader waits, torch.save
    every 40 steps, a 16 MiB write+fsync every 50, a 0.6 s stall every 60 (step 120 saves and
    stalls: the save is a checkpoint, the rest of the step a stall)."""
    proc, job = start_job(world, "--dims", DIMS, "--batch", str(BATCH), "--step-sleep", "0.01",
                          "--loader-sleep", "0.004", "--save-every", "40", "--write-every", "50",
                          "--stall-every", "60", "--stall-s", "0.6", "--out", str(tmp_path))
    with running(proc):
        def booked():
            status = agent_status(job["pid"], timeout=ANSWER_S)
            seconds = ((status or {}).get("goodput") or {}).get("seconds") or {}
            return status if status["steps"] >= 130 and all(
                seconds.get(k, 0) > 0 for k in ("productive", "startup", "dataloader",
                                                 "checkpoint", "stall", "capture")) else None

        status = wait_for(booked, timeout=3 * SLOW, interval=0.5)
        ledger = status["goodput"]
        seconds = ledger["seconds"]
        # Every category is booked (`booked`); how many seconds each gets against what the job
        # slept or wrote is benchmarks/bench_goodput.py's to print, not a busy machine's to meet.
        total = sum(seconds.values())
        assert abs(total + ledger["in_step_s"] - ledger["wall_s"]) < 0.5, ledger
        assert 0 < ledger["goodput"] < 1
        assert ledger["goodput"] == pytest.approx(seconds["productive"] / total, abs=2e-3)


def attach_and_snapshot(env: dict[str, str], pid: int, scenario: str, seconds: float) -> dict:
    done = subprocess.run([sys.executable, "-m", "gputop", "--demo", scenario, "--gpus", "0",
                           "snapshot", "--json", "--measure", str(seconds)],
                          env={**env, "GPUTOP_DEMO_PIDS": f"0:{pid}"}, cwd=REPO,
                          capture_output=True, text=True, timeout=SLOW)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_mfu_is_the_counted_flops_at_the_measured_rate_over_the_boards_peak(world):
    """A job put on a simulated A100: MFU = FLOPs/step x steps/s / 19.5 TFLOP/s (the A100
    datasheet's fp32), J/step from the simulated energy counter, no GPM (an A100 has none)."""
    proc, job = start_job(world, "--dims", DIMS, "--batch", str(BATCH), "--step-sleep", "0.02")
    with running(proc):
        counted(job["pid"])
        snap = attach_and_snapshot(world, job["pid"], "input-starved", 4)
        proc_json = snap["gpus"][0]["processes"][0]
        eff, agent = proc_json["efficiency"], proc_json["agent"]
        assert snap["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"
        assert eff["device"] == "A100" and eff["peak_flops"] == 19.5e12
        assert "A100" in eff["peak_source"] and "datasheet" in eff["peak_source"]
        assert eff["flops_per_step"] == job["flops"]
        assert eff["achieved_flops"] == pytest.approx(job["flops"] * agent["steps_per_s"])
        assert eff["mfu"] == pytest.approx(eff["achieved_flops"] / 19.5e12)
        assert eff["tensor_active"] is None and eff["tensor_agrees"] is None
        assert eff["j_per_step"] > 0 and eff["energy_window_s"] > 0
        assert eff["j_per_sample"] == pytest.approx(eff["j_per_step"] / BATCH)
        assert 0 < eff["goodput"] < 1 and eff["goodput_s"]["startup"] > 0


def test_gpm_tensor_activity_cross_checks_mfu(world):
    """bf16 on a simulated H100 with GPM: tensor pipes ~45 % busy while this CPU job's counted
    FLOPs fill a millionth of the bf16 peak: flagged as a disagreement, with the reason."""
    proc, job = start_job(world, "--dims", DIMS, "--batch", str(BATCH), "--bf16")
    with running(proc):
        assert counted(job["pid"])["flops"]["last"]["precision"] == "bf16"
        snap = attach_and_snapshot(world, job["pid"], "healthy", 3)
        eff = snap["gpus"][0]["processes"][0]["efficiency"]
        assert eff["device"] == "H100 SXM" and eff["peak_flops"] == peak_for(
            "NVIDIA H100 80GB HBM3", "bf16").flops
        assert eff["tensor_active"] > 20
        assert eff["tensor_agrees"] is False and "does not see" in eff["tensor_note"]
        # Measured past the simulated job's start-up (no kernels run before it).
        text = run_cli("--demo", "healthy", "--gpus", "0", "snapshot", "--measure",
                       str(STARTUP_S + 2),
                       env={**world, "GPUTOP_DEMO_PIDS": f"0:{job['pid']}"})
        assert "GPM cross-check DISAGREES" in text.stdout, text.stdout


def test_without_a_gpu_the_achieved_rate_is_shown_and_why_no_mfu(world):
    proc, job = start_job(world, "--dims", DIMS, "--batch", str(BATCH))
    with running(proc):
        counted(job["pid"])
        snap = json.loads(run_cli("--demo", "no-driver", "snapshot", "--json",
                                  env=world).stdout)
        mine = [p for p in snap["processes"] if p["pid"] == job["pid"]][0]["efficiency"]
        assert mine["mfu"] is None and mine["achieved_flops"] > 0
        assert "not on a GPU" in mine["mfu_note"]


def record(env: dict[str, str], pid: int, out: Path, seconds: int) -> None:
    done = subprocess.run([sys.executable, "-m", "gputop", "--demo", "input-starved",
                           "--interval", "1", "record", "-o", str(out), "--duration",
                           str(seconds), "--flush-every", "5"],
                          env={**env, "GPUTOP_DEMO_PIDS": f"0:{pid}"}, cwd=REPO,
                          capture_output=True, text=True, timeout=SLOW + seconds)
    assert done.returncode == 0, done.stderr


def recorded_job(env: dict[str, str], tmp_path: Path, name: str, dims: str) -> Path:
    """A steady job (a 50 ms host pause per step sets its pace, whatever the model's width)
    recorded on a simulated A100 after its FLOP count."""
    proc, job = start_job(env, "--dims", dims, "--batch", str(BATCH), "--step-sleep", "0.05")
    with running(proc):
        counted(job["pid"])
        out = tmp_path / f"{name}.parquet"
        record(env, job["pid"], out, 12)
        return out


def test_report_prints_goodput_and_j_per_step_and_gates_on_mfu(world, tmp_path):
    """Acceptance 3: the report of a recorded job prints goodput with its breakdown and J/step,
    and --baseline with --max-regression fails when MFU drops (here: a narrower model at the same
    step rate, so throughput alone would not)."""
    with ThreadPoolExecutor(2) as pool:  # both wait out their 12 s at once
        wide, narrow = pool.map(lambda a: recorded_job(world, tmp_path, *a),
                                [("wide", "64,512,512,10"), ("narrow", "64,128,128,10")])
    report = run_cli("report", str(wide))
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "efficiency of pid" in text
    goodput_line = next(line for line in text.splitlines() if line.strip().startswith("goodput"))
    # The job started before the recording: its start-up is not the recording's.
    assert "productive" in goodput_line and "DataLoader" in goodput_line, goodput_line
    assert "start-up" not in goodput_line
    assert "J/step" in text and "J/sample" in text and "MFU" in text
    summary = json.loads(run_cli("report", str(wide), "--json").stdout)
    metrics = summary["metrics"]
    assert metrics["mfu"] > 0 and metrics["job_energy_per_step_j"] > 0
    assert set(metrics["goodput_seconds"]) >= {"productive", "dataloader"}

    same = run_cli("report", str(wide), "--baseline", str(wide), "--max-regression", "25%")
    assert same.returncode == 0 and "MFU" in same.stderr, same.stderr
    dropped = run_cli("report", str(narrow), "--baseline", str(wide), "--max-regression", "25%")
    assert dropped.returncode == 1, dropped.stderr
    reason = dropped.stderr.strip().splitlines()
    # Only MFU regressed: the narrow model steps as fast (faster), so throughput is no problem.
    assert len(reason) == 1 and reason[0].startswith("gputop: regression: MFU"), reason
    assert "throughput" not in reason[0]


@pytest.fixture(scope="module")
def tour_runs(tmp_path_factory, tour_recording, share_process):
    """The tour's recording (shared with the replay's tests) and a snapshot measuring the tour
    over 25 s, both at once: each only waits out its time."""
    snapshot = Background(tmp_path_factory.mktemp("tour"), "snapshot", "--demo", "tour",
                          "--gpus", "0", "snapshot", "--json", "--measure", "25")
    share_process(snapshot.proc)
    yield tour_recording, snapshot
    end_popen(snapshot.proc)


def test_tour_recording_report_has_the_trainers_efficiency(tour_runs):
    """Acceptance 3 on the demo: `gputop --demo tour` records its torch job's efficiency."""
    recording = tour_runs[0]
    out = recording.path
    code, _, err = recording.result(SLOW + TOUR_RECORD_S)
    assert code == 0, err
    report = run_cli("report", str(out))
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("efficiency of pid")))
    block = "\n".join(lines[head:head + 4])
    assert "on GPU 0" in block and "MFU" in block and "A100" in block
    assert "goodput" in block and "DataLoader" in block and "J/step" in block


def test_tour_snapshot_mfu_follows_from_the_simulated_peak_and_the_measured_steps(tour_runs):
    """Acceptance 2's numbers: the tour's GPU 0 is a simulated A100 running the torch demo
    trainer; MFU = its counted FLOPs x its agent's steps/s / 19.5 TFLOP/s, and J/step comes
    from the simulated energy counter over the steps the agent counted."""
    code, out, err = tour_runs[1].result(SLOW + 25)
    assert code == 0, err
    gpu = json.loads(out)["gpus"][0]
    trainer = next(p for p in gpu["processes"] if "gputop.demo.train" in p["cmdline"])
    eff, agent = trainer["efficiency"], trainer["agent"]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB" and eff["peak_flops"] == 19.5e12
    assert eff["mfu"] == pytest.approx(eff["flops_per_step"] * agent["steps_per_s"] / 19.5e12)
    assert eff["j_per_step"] > 0 and 0 < eff["goodput"] < 1


def test_tour_monitor_shows_mfu_goodput_and_j_per_step():
    """Acceptance 2: `gputop --demo tour` in a terminal, its GPU 0 job's row (the torch trainer
    with the agent): MFU, goodput, J/step."""
    tmux_or_skip()
    term = Tmux(120, 40, cli_env())
    try:
        proc = start(term)

        def gpu0_row() -> str | None:
            for line in term.capture().splitlines():
                # MFU n/a until the agent's count after warm-up: wait for the number.
                if (re.match(r"^\W*0\s+\d+\s", line) and re.search(r"MFU [0-9.e-]+%", line)
                        and "J/step" in line):
                    return line
            return None

        row = wait_for(gpu0_row, timeout=3 * SLOW, interval=1.0)
        assert "goodput" in row, row
        # The numbers are the ones the snapshot gives: MFU against the A100's fp32 peak.
        mfu = float(re.search(r"MFU ([0-9.e-]+)%", row).group(1))
        assert 0 < mfu < 1
        term.keys("q")
        proc.wait(timeout=SLOW)
    finally:
        running_procs = term.processes()
        term.kill()
        end_processes(running_procs)


def test_auto_count_can_be_turned_off(world):
    proc, job = start_job({**world, "GPUTOP_FLOP_COUNT": "0"}, "--dims", DIMS)
    with running(proc):
        wait_for(lambda: (agent_status(job["pid"], timeout=ANSWER_S) or {}).get("steps", 0) > 15,
                 timeout=SLOW)
        time.sleep(0.5)
        flops = agent_status(job["pid"], timeout=ANSWER_S)["flops"]
        assert flops["state"] == "idle" and "last" not in flops
