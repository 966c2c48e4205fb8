"""`gputop report --baseline` that fails on step times says why: the compare of both
recordings' capture traces, under the verdict. Real recordings of the demo's torch job (the
same job, every step 80 % slower in one: clear of the noise of a busy host), with real CPU traces of one job in their captures/
(tests/data/compare: the DataLoader slowed in the slow recording's, fixed in the baseline's)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO, SLOW, cli_env, run_cli

PAIR = REPO / "tests" / "data" / "compare"


def _record(target: Path, slowdown: str) -> Path:
    done = run_cli("--demo", "input-starved", "record", "-o", str(target), "--duration", "30",
                   env=cli_env(GPUTOP_DEMO_SLOWDOWN=slowdown, GPUTOP_DEMO_PACE_MS="25"),
                   timeout=4 * SLOW)
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    where = tmp_path_factory.mktemp("why")
    with ThreadPoolExecutor(2) as pool:
        base, slow = pool.map(lambda a: _record(where / a[0], a[1]),
                              [("base", "0"), ("slow", "80%")])
    return base, slow


@pytest.mark.timeout(8 * SLOW)
def test_a_failed_gate_prints_the_compare_of_the_captures(runs):
    base, slow = runs
    plain = run_cli("report", str(slow), "--baseline", str(base))
    assert plain.returncode == 1, plain.stderr
    assert "regression: " in plain.stderr
    assert "why, from the recordings' captures" not in plain.stderr  # no capture: no compare
    shutil.copytree(PAIR / "fixed", base / "captures")
    shutil.copytree(PAIR / "input_bound", slow / "captures")
    done = run_cli("report", str(slow), "--baseline", str(base))
    assert done.returncode == 1, done.stderr
    verdict, why = done.stderr.split("why, from the recordings' captures", 1)
    assert "regression: " in verdict
    first = why.splitlines()[1].strip()
    assert first.startswith("NEW is ") and "slower a step" in first and "DataLoader wait" in first
    assert "Traceback" not in done.stderr
