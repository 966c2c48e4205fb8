"""The "where" line of live findings, on real processes with the real py-spy: sampled off the
caller's thread, once per finding, at most once per process per interval (a second finding
on the same process reuses the stacks), and where a hung process waits."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from gputop.diagnostics.findings import Finding
from gputop.stacks.pyspy import sample_stacks
from gputop.stacks.where import WhereFinder
from tests.conftest import SLOW
from tests.scripts.stacks_testkit import (
    BURNER,
    stacks_readable,  # noqa: F401 (the fixture)
)

pytestmark = [pytest.mark.timeout(3 * SLOW), pytest.mark.usefixtures("stacks_readable")]

HUNG = ("import threading\n"
        "def wait_for_peer(event):\n"
        "    event.wait()\n"
        "print('ready', flush=True)\n"
        "wait_for_peer(threading.Event())\n")


def started(spawn, code: str) -> subprocess.Popen:
    proc = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def finding(kind: str, pid: int) -> Finding:
    return Finding(id=kind, severity="warning", title=f"{kind} on pid {pid}", evidence="e",
                   fix="f", next_step="n", gpu=0, pid=pid)


class CountingSampler:
    """The real sampler, counted (so the rate limit shows)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return sample_stacks(*args, **kwargs)


def until_ready(finder: WhereFinder, findings: list[Finding], without_agent=(),
                expect: list[Finding] | None = None) -> list:
    """Feed ``findings`` each tick until the where lines of ``expect`` (default: all of
    them) come back."""
    deadline = time.monotonic() + SLOW
    ready: list[Finding] = []
    wanted = {(f.id, f.pid) for f in (findings if expect is None else expect)}
    while {(f.id, f.pid) for f in ready} != wanted:
        assert time.monotonic() < deadline, "no where line in time"
        ready += finder.update(findings, without_agent)
        time.sleep(0.1)
    return ready


def test_a_stall_gets_its_function_once_per_process(spawn):
    burner = started(spawn, BURNER)
    sampler = CountingSampler()
    finder = WhereFinder(sampler=sampler, seconds=1)
    stall = finding("dataloader-stall", burner.pid)
    started_at = time.monotonic()
    assert finder.update([stall]) == []  # queued: the caller does not wait for py-spy
    assert time.monotonic() - started_at < 1.0
    (ready,) = until_ready(finder, [stall])
    assert ready.where.startswith("parse_records (<string>:"), ready.where
    assert ready.where.endswith("% of main-process samples")
    assert finder.enrich([stall])[0].where == ready.where
    assert finder.update([stall]) == []  # told once
    # A second finding on the same process within the interval reuses those stacks.
    sync = finding("host-sync", burner.pid)
    until_ready(finder, [stall, sync], expect=[sync])
    assert sampler.calls == 1
    # Cleared, then raised again: asked again, still from the same recent stacks.
    finder.update([])
    until_ready(finder, [stall])
    assert sampler.calls == 1
    # Not a finding that has a where line: nothing is sampled for it.
    idle = finding("gpu-idle", burner.pid)
    finder.update([idle])
    time.sleep(0.5)
    assert finder.enrich([idle])[0].where is None and sampler.calls == 1
    finder.close()


def test_auto_capture_asks_for_other_stalls_of_processes_without_an_agent(spawn):
    burner = started(spawn, BURNER)
    finder = WhereFinder(ids_without_agent={"gpu-idle"}, seconds=1, min_interval=0.0)
    idle = finding("gpu-idle", burner.pid)
    finder.update([idle], without_agent=())  # it has an agent: a capture's business
    time.sleep(0.5)
    assert finder.enrich([idle])[0].where is None
    finder.update([], ())
    (ready,) = until_ready(finder, [idle], without_agent={burner.pid})
    assert "parse_records" in ready.where
    finder.close()


def test_a_hung_process_says_where_it_waits(spawn):
    hung = started(spawn, HUNG)
    finder = WhereFinder(seconds=1)
    (ready,) = until_ready(finder, [finding("hung", hung.pid)])
    assert ready.where.startswith("MainThread waits in "), ready.where
    assert "threading.py:" in ready.where and ready.where.endswith("in <string>:3")
    finder.close()


def test_a_process_it_cannot_read_says_why(spawn):
    sleeper = spawn(["sleep", "120"])
    finder = WhereFinder(seconds=1)
    (ready,) = until_ready(finder, [finding("hung", sleeper.pid)])
    assert ready.where.startswith("not known: pid") and "not a Python process" in ready.where
    finder.close()


def test_close_ends_a_sampling_in_progress(spawn):
    burner = started(spawn, BURNER)
    finder = WhereFinder(seconds=30)
    finder.update([finding("dataloader-stall", burner.pid)])

    def py_spies() -> list:
        return [c for c in psutil.Process().children(recursive=True)
                if c.name() == "py-spy" and c.status() != psutil.STATUS_ZOMBIE]

    deadline = time.monotonic() + SLOW
    while not py_spies():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    finder.close()
    while py_spies():
        assert time.monotonic() < deadline, "py-spy still runs after close()"
        time.sleep(0.05)
