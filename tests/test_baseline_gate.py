"""`report --baseline` tells a regression from noise (issue 38): the gate's statistics on known
numbers, untrusted metrics.json input, and real recordings of the demo's torch job, the same job
and the same job with every step 30 % slower (GPUTOP_DEMO_SLOWDOWN)."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from gputop.recording.gate import (
    clean_intervals,
    compare_steps,
    mann_whitney_greater,
    step_intervals,
)
from tests.conftest import SLOW, cli_env, run_cli


def test_mann_whitney_on_known_samples():
    # Fully separated samples of 10 each: U = 100, z = (100 - 50 - 0.5) / sqrt(175) = 3.742.
    p = mann_whitney_greater([float(v) for v in range(11, 21)], [float(v) for v in range(10)])
    assert p == pytest.approx(9.1e-5, rel=0.02)
    same = mann_whitney_greater([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert 0.5 <= same <= 0.7  # no evidence either way
    assert mann_whitney_greater([5.0] * 9, [5.0] * 9) == 1.0  # all tied: no variance


def test_noise_passes_and_a_shift_beyond_it_fails():
    rng = random.Random(38)
    base = [0.1 * rng.lognormvariate(0, 0.4) for _ in range(40)]  # a noisy run: IQR ~50 %
    same = [0.1 * rng.lognormvariate(0, 0.4) for _ in range(40)]
    slow = [v * 1.3 for v in (0.1 * rng.lognormvariate(0, 0.1) for _ in range(40))]
    regressed, text = compare_steps(same, base, 0.05)
    assert not regressed and "Mann-Whitney" in text
    steady = [0.1 * rng.lognormvariate(0, 0.1) for _ in range(40)]
    assert compare_steps(slow, steady, 0.05)[0]
    # A significant shift smaller than --max-regression does not fail.
    assert not compare_steps([v * 1.03 for v in steady], steady, 0.05)[0]
    assert compare_steps(slow[:3], steady, 0.05) is None  # too few: the single figures decide


def test_step_intervals_leave_out_start_up_and_merge_stalls():
    rows = pd.DataFrame({"time": [0.0, 1, 2, 3, 4, 5, 6, 7, 8], "pid": 7,
                         "steps": [0.0, 0, 3, 13, 13, 33, 43, 47, 53]})
    # 0->3 holds the first steps (start-up: left out); 3->4 has none (merged into 4->5);
    # 6->7 has 4 steps, fewer than MIN_STEPS (merged with 7->8).
    assert step_intervals(rows, 7) == [0.1, 0.1, 0.1, 0.2]
    assert step_intervals(rows, 8) == [] and step_intervals(rows, None) == []


@pytest.mark.parametrize("value", ["x", {"a": 1}, [0.1, "x"], [0.1, -1.0], [float("nan")],
                                   [True], [0.1] * 5000])
def test_a_forged_metrics_json_gives_no_step_times(value):
    assert clean_intervals(value) == []


def test_a_forged_baseline_is_one_line_not_a_traceback(tmp_path, demo_runs):
    base, _, _ = demo_runs
    forged = tmp_path / "forged.json"
    metrics = json.loads(run_cli("report", str(base), "--json").stdout)["metrics"]
    metrics["step_intervals_s"] = {"not": "a list"}
    forged.write_text(json.dumps(metrics))
    done = run_cli("report", str(base), "--baseline", str(forged))
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr
    assert "too few step times" in done.stderr


def _record(target: Path, slowdown: str) -> Path:
    done = run_cli("--demo", "input-starved", "record", "-o", str(target), "--duration", "30",
                   env=cli_env(GPUTOP_DEMO_SLOWDOWN=slowdown, GPUTOP_DEMO_PACE_MS="80"),
                   timeout=4 * SLOW)
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """Three recordings of the demo's torch job made at once, so that the machine's load (other
    users' work comes and goes) weighs on the three alike: a baseline, the same job again, and
    the same job with every step 30 % slower. The job is paced (GPUTOP_DEMO_PACE_MS): the
    starved job's step time follows its share of the cores, and three of them with their six
    workers on two busy cores got unequal shares (identical runs differed by 21 %). The pace is
    80 ms, well above the step's own CPU time: at 25 ms a loaded CI host made that CPU time half
    of every step, its spread (IQR/median 54 %) hid the 30 % slowdown (p=0.022)."""
    where = tmp_path_factory.mktemp("gate")
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda a: _record(where / a[0], a[1]),
                             [("base.parquet", "0"), ("same.parquet", "0"),
                              ("slow.parquet", "30%")]))
    return tuple(runs)


@pytest.mark.timeout(8 * SLOW)
def test_identical_demo_runs_pass_and_a_30_percent_slower_one_fails(demo_runs):
    base, same, slow = demo_runs
    ok = run_cli("report", str(same), "--baseline", str(base))
    assert ok.returncode == 0, ok.stderr
    assert "no regression" in ok.stderr and "Mann-Whitney" in ok.stderr
    regressed = run_cli("report", str(slow), "--baseline", str(base))
    print(f"\nsame: {ok.stderr.strip()}\nslow: {regressed.stderr.strip()}")
    assert regressed.returncode == 1, regressed.stderr
    assert "regression: median step time" in regressed.stderr


def test_without_gpus_the_report_takes_the_recorders_own_job():
    """Issue 38, item 2: on a host without GPUs, root's recording saw another user's agent too;
    the report's job is the recorder's user's, when it has one."""
    from gputop.recording.summary import reported_processes, training_jobs

    def proc(pid: int, user: str, steps: int) -> dict:
        return {"pid": pid, "user": user, "steps": steps, "gpus": [], "gpu_mem_peak": None,
                "throughput_steps_per_s": 10.0}

    theirs, mine = proc(1, "alice", 9000), proc(2, "root", 100)
    assert [p["pid"] for p in training_jobs(reported_processes([theirs, mine], False, "root"))] \
        == [2]
    # Nobody's own: every job stays (an older recording has no user).
    assert len(reported_processes([theirs, mine], False, None)) == 2
    assert len(reported_processes([theirs], False, "root")) == 1
