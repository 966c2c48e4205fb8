"""Issue 37, acceptance 1: root's exporter beside a victim's real training job and a hostile
"agent" of another uid on the same GPU, which says ``rank: null``, steps faster than anything
and puts every number outside its meaning. The real exporter is scraped over HTTP; the monitor's
text is the real ``gputop snapshot``."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, SLOW, cli_env, end_popen, run_cli, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")

NOBODY = 65534
HOSTILE = str(REPO / "tests" / "scripts" / "hostile_agent.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def unscoped(monkeypatch):
    """Another user's agent listens in that user's directory, which root finds by the default
    discovery, not in the tests' own scope ($GPUTOP_SOCKET_DIR, conftest): the victim's job and
    the exporter use it too. Foreign agents on the host only add series of their own."""
    monkeypatch.delenv("GPUTOP_SOCKET_DIR")


@pytest.fixture
def absurd_agent():
    """A process of uid 65534 whose agent socket answers `status` with absurd values."""
    proc = subprocess.Popen([sys.executable, HOSTILE, "--uid", str(NOBODY), "--kind", "absurd"],
                            stdout=subprocess.PIPE, text=True, env=cli_env(), cwd="/")
    line = proc.stdout.readline().split()
    try:
        assert line and line[0] == "ready"
        yield proc
    finally:
        end_popen(proc)
        if len(line) > 1 and line[1].startswith("/tmp/hostile-"):
            shutil.rmtree(line[1], ignore_errors=True)
        try:
            os.unlink(f"/tmp/gputop-{NOBODY}/{proc.pid}.sock")
        except OSError:
            pass


def scrape(port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_a_hostile_agent_of_another_user_cannot_take_over_or_poison_job_series(
        steady_agent_job, absurd_agent, spawn):
    victim, hostile = steady_agent_job.pid, absurd_agent.pid
    env = cli_env(GPUTOP_DEMO_PIDS=f"0:{victim},0:{hostile}")
    port = free_port()
    exporter = spawn([sys.executable, "-m", "gputop", "--demo", "healthy", "--interval", "0.5",
                      "exporter", "--listen", f"127.0.0.1:{port}"], env=env, cwd=REPO,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def both_jobs():
        try:
            samples = scrape(port)
        except OSError:
            return None
        jobs = [s for s in samples if s.name.startswith("gputop_job_")]
        uids = {s.labels["uid"] for s in jobs if s.labels["job_id"].startswith(f"pid:{hostile}@")}
        victim_rate = [s for s in jobs if s.name == "gputop_job_steps_per_second"
                       and s.labels["job_id"].startswith(f"pid:{victim}@")]
        return samples if uids == {str(NOBODY)} and victim_rate else None

    samples = wait_for(both_jobs, timeout=2 * SLOW, interval=0.5)
    assert exporter.poll() is None
    jobs = [s for s in samples if s.name.startswith("gputop_job_")]
    # (Other engineers' jobs on this machine may have series too: the victim's are its pid's.)
    mine = [s for s in jobs if s.labels["job_id"].startswith(f"pid:{victim}@")]
    theirs = [s for s in jobs if s.labels["job_id"].startswith(f"pid:{hostile}@")]
    assert {s.labels["uid"] for s in theirs} == {str(NOBODY)}
    # The victim's series keep the victim's values: ~50 steps/s, on GPU 0, root's.
    rate = next(s for s in mine if s.name == "gputop_job_steps_per_second")
    assert 1 < rate.value < 200 and rate.labels["gpu"] == "0" and rate.labels["uid"] == "0"
    # The hostile process has series of its own (its uid), holding nothing it lied about.
    assert theirs and {s.labels["job_id"] for s in theirs} != {rate.labels["job_id"]}
    names = {s.name for s in theirs}
    for lied in ("gputop_job_steps_per_second", "gputop_job_steps_total",
                 "gputop_job_step_time_seconds", "gputop_job_dataloader_wait_ratio",
                 "gputop_job_mfu_ratio", "gputop_job_goodput_ratio",
                 "gputop_job_achieved_flops_per_second"):
        assert lied not in names, (lied, theirs)
    # No ratio outside 0-1, no negative counter, no time negative or infinite: anywhere.
    for s in samples:
        assert math.isfinite(s.value), s
        if s.name.endswith("_ratio"):
            assert 0.0 <= s.value <= 1.0, s
        if s.name.endswith("_total") or s.name.endswith("_seconds"):
            assert s.value >= 0, s
    assert all(s.value < 1e18 for s in samples if "flops" in s.name)

    # The monitor's text and JSON: the same checked values; what was dropped is counted.
    text = run_cli("--demo", "healthy", "snapshot", env=env)
    assert text.returncode == 0, text.stderr
    for bad in ("1000000000", "1e+09", "-1000 ms", "750%", "stalls 50% · hangs 50%"):
        assert bad not in text.stdout, (bad, text.stdout)
    data = json.loads(run_cli("--demo", "healthy", "snapshot", "--json", env=env).stdout)
    procs = {p["pid"]: p for g in data["gpus"] for p in g["processes"]}
    assert procs[hostile]["uid"] == NOBODY and procs[victim]["uid"] == 0
    rejected = set(procs[hostile]["agent"]["rejected"])
    assert {"steps", "steps_per_s", "step_time_p50_s", "step_time_p95_s",
            "dataloader_wait_share", "goodput.goodput", "flops.last.flops_per_step"} <= rejected
    # torch.compile's: the same rule (refused and named, no health shown from them).
    assert {"compile.compiles", "compile.recompiles", "compile.compile_s",
            "compile.blocked_after_warmup_s", "compile.cudagraph.rerecords",
            "compile.functions.0.compiles", "compile.functions.0.line"} <= rejected
    assert procs[hostile].get("compiled") is None
    assert "rejected" not in procs[victim]["agent"]
