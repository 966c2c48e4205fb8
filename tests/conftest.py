"""Shared test helpers: run the real CLI in a subprocess, find ../shared, wait on conditions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for running `python -m gputop` from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputop", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=kw.pop("env", None) or cli_env(),
        cwd=kw.pop("cwd", REPO),
        **kw,
    )


def wait_for(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.05):
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition}")
        time.sleep(interval)


@pytest.fixture
def sim_clock():
    """A settable clock for the simulated driver: ``sim_clock.t = 12.0``."""

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    return Clock()


@pytest.fixture
def simulated(sim_clock):
    """Install a scenario's simulated NVML: ``sim = simulated('tour')``; uninstalled after."""
    from gputop.collect import simnvml
    from gputop.collect.scenarios import SCENARIOS

    def install(name: str, seed: int = 0):
        return simnvml.install(simnvml.SimulatedNvml(SCENARIOS[name], seed=seed, clock=sim_clock))

    yield install
    simnvml.uninstall()
