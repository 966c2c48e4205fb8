"""Captures through the agent of a real training job, and how they fail."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from gputop.agent import client
from tests.conftest import wait_for
from tests.scripts.agent_testkit import (
    gputop_run,
    private_agent_world,
    running,
    train_cmd,
    wait_for_steps,
)

TRACE_NAME = re.compile(
    rf"^{re.escape(socket.gethostname())}_(\d+)\.(\d{{13}})\.pt\.trace\.json\.gz$"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    captures = tmp_path_factory.mktemp("captures")
    with private_agent_world(captures) as (env, _):
        yield env, captures


@pytest.fixture(scope="module")
def job(world):
    env, _ = world
    proc = gputop_run(train_cmd("--steps", "0", "--item-ms", "3"), env)
    with running(proc):
        wait_for_steps(proc.pid, steps=3)
        yield proc


def trace_events(path: str | Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def in_background(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except Exception as exc:  # handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def capture_state(pid: int) -> str:
    status = client.agent_status(pid, timeout=2.0) or {}
    return (status.get("capture") or {}).get("state", "?")


def test_step_capture_writes_a_private_trace_of_exactly_those_steps(world, job):
    _, captures = world
    reply = client.request(job.pid, {"cmd": "capture", "steps": 3}, timeout=60)
    path = Path(reply["trace"])
    assert path.parent == captures
    match = TRACE_NAME.match(path.name)
    assert match and int(match.group(1)) == job.pid
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert reply["bytes"] == path.stat().st_size
    assert sorted(os.listdir(captures)) == [path.name]  # no temp files left behind
    events = trace_events(path)
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert len(steps) == 3  # the warm-up step is not in the trace
    names = {e.get("name") for e in events}
    assert "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" in names
    assert "aten::addmm" in names  # the training thread's ops were seen
    summary = reply["summary"]
    assert summary["dataloader_wait_share"] > 0.5
    assert summary["step_time_mean_s"] > 0 and summary["blocked_s"] < summary["duration_s"]
    status = client.agent_status(job.pid)
    assert status["capture"]["state"] == "idle"
    assert status["capture"]["last"]["trace"] == str(path)


def test_second_capture_at_once_is_told_busy(job):
    thread, box = in_background(client.request, job.pid, {"cmd": "capture", "steps": 6}, timeout=60)
    wait_for(lambda: capture_state(job.pid) != "idle", timeout=10)
    with pytest.raises(client.AgentError) as err:
        client.request(job.pid, {"cmd": "capture", "steps": 1}, timeout=10)
    assert err.value.code == "busy" and "already running" in str(err.value)
    thread.join(60)
    assert "error" not in box, box
    assert Path(box["value"]["trace"]).exists()


def test_cancel_stops_a_capture_and_training_goes_on(job):
    thread, box = in_background(client.request, job.pid, {"cmd": "capture", "steps": 500}, timeout=60)
    wait_for(lambda: capture_state(job.pid) == "recording", timeout=10)
    assert client.request(job.pid, {"cmd": "cancel"})["cancelled"] is True
    thread.join(30)
    assert isinstance(box.get("error"), client.AgentError) and box["error"].code == "cancelled"
    steps = client.agent_status(job.pid)["steps"]
    wait_for(lambda: client.agent_status(job.pid)["steps"] > steps + 2, timeout=10)
    assert capture_state(job.pid) == "idle"


def test_unwritable_capture_dir_is_an_error_reply_and_training_goes_on(job, tmp_path):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    for out in (str(a_file / "sub"), "/proc/gputop-captures"):
        with pytest.raises(client.AgentError) as err:
            client.request(job.pid, {"cmd": "capture", "steps": 2, "out": out}, timeout=30)
        assert err.value.code == "capture-dir" and out in str(err.value)
    steps = client.agent_status(job.pid)["steps"]
    wait_for(lambda: client.agent_status(job.pid)["steps"] > steps + 2, timeout=10)


@pytest.fixture
def full_disk(tmp_path):
    """A 96 KiB tmpfs: room for the directory, not for a trace."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here: " + done.stderr.decode().strip())
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_capture_dir_is_an_error_reply_and_nothing_is_left_behind(job, full_disk):
    with pytest.raises(client.AgentError) as err:
        # Shapes and stacks make the trace far larger than the file system.
        client.request(
            job.pid,
            {
                "cmd": "capture",
                "steps": 4,
                "out": str(full_disk),
                "record_shapes": True,
                "with_stack": True,
            },
            timeout=60,
        )
    assert err.value.code == "export-failed" and str(full_disk) in str(err.value)
    assert os.listdir(full_disk) == []
    steps = client.agent_status(job.pid)["steps"]
    wait_for(lambda: client.agent_status(job.pid)["steps"] > steps + 2, timeout=10)
    assert client.agent_status(job.pid)["agent_errors"] == 0


def _losses(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines() if line.startswith("loss ")]


def test_loss_sequence_is_identical_without_agent_with_agent_and_with_a_capture(world):
    env, _ = world
    args = ("--steps", "16", "--seed", "7", "--item-ms", "4", "--print-loss")
    plain_env = {k: v for k, v in env.items()}
    plain = subprocess.Popen(train_cmd(*args), env=plain_env, stdout=subprocess.PIPE, text=True)
    idle = gputop_run(train_cmd(*args), env)
    captured = gputop_run(train_cmd(*args), env)
    with running(plain), running(idle), running(captured):
        wait_for_steps(captured.pid, steps=2)
        reply = client.request(captured.pid, {"cmd": "capture", "steps": 3}, timeout=60)
        assert Path(reply["trace"]).exists()  # so the capture happened mid-run
        outputs = [p.communicate(timeout=60)[0] for p in (plain, idle, captured)]
        assert [p.returncode for p in (plain, idle, captured)] == [0, 0, 0]
    sequences = [_losses(out) for out in outputs]
    assert len(sequences[0]) == 16
    assert sequences[0] == sequences[1] == sequences[2]
