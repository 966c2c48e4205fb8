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

from gputop.client import agents as client
from tests.conftest import SLOW, small_tmpfs, wait_for
from tests.scripts.agent_testkit import (
    ANSWER_S,
    gputop_run,
    private_agent_world,
    running,
    status_of,
    train_cmd,
    wait_for_more_steps,
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


def capture_state(pid: int) -> str | None:
    """The capture's state, or None when the agent did not answer in time (ask again)."""
    status = client.agent_status(pid, timeout=ANSWER_S)
    return None if status is None else (status.get("capture") or {}).get("state", "?")


def test_step_capture_writes_a_private_trace_of_exactly_those_steps(world, job):
    _, captures = world
    reply = client.request(job.pid, {"cmd": "capture", "steps": 3}, timeout=SLOW)
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
    status = status_of(job.pid)
    assert status["capture"]["state"] == "idle"
    assert status["capture"]["last"]["trace"] == str(path)


def test_second_capture_at_once_is_told_busy(job):
    thread, box = in_background(client.request, job.pid, {"cmd": "capture", "steps": 6},
                                timeout=SLOW)
    wait_for(lambda: capture_state(job.pid) not in (None, "idle"), timeout=SLOW)
    with pytest.raises(client.AgentError) as err:
        client.request(job.pid, {"cmd": "capture", "steps": 1}, timeout=SLOW)
    assert err.value.code == "busy" and "already running" in str(err.value)
    thread.join(SLOW + 10)
    assert not thread.is_alive()
    assert "error" not in box, box
    assert Path(box["value"]["trace"]).exists()


def test_cancel_stops_a_capture_and_training_goes_on(job):
    # 500 steps take far longer than the wait for "recording" (even on a loaded machine): the
    # cancel comes mid-capture, and the reply to the capture says it was cancelled.
    thread, box = in_background(client.request, job.pid, {"cmd": "capture", "steps": 500},
                                timeout=SLOW)
    wait_for(lambda: capture_state(job.pid) == "recording", timeout=SLOW)
    assert client.request(job.pid, {"cmd": "cancel"}, timeout=ANSWER_S)["cancelled"] is True
    thread.join(SLOW)
    assert isinstance(box.get("error"), client.AgentError) and box["error"].code == "cancelled"
    wait_for_more_steps(job.pid)
    assert wait_for(lambda: capture_state(job.pid), timeout=SLOW) == "idle"


def test_unwritable_capture_dir_is_an_error_reply_and_training_goes_on(job, tmp_path):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    for out in (str(a_file / "sub"), "/proc/gputop-captures"):
        with pytest.raises(client.AgentError) as err:
            client.request(job.pid, {"cmd": "capture", "steps": 2, "out": out}, timeout=SLOW)
        assert err.value.code == "capture-dir" and out in str(err.value)
    wait_for_more_steps(job.pid)


@pytest.fixture
def full_disk(tmp_path):
    """A 96 KiB tmpfs: room for the directory, not for a trace."""
    with small_tmpfs(tmp_path / "full", "96k") as mount:
        yield mount


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
            timeout=SLOW,
        )
    assert err.value.code == "export-failed" and str(full_disk) in str(err.value)
    assert os.listdir(full_disk) == []
    assert wait_for_more_steps(job.pid)["agent_errors"] == 0


def _losses(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines() if line.startswith("loss ")]


def test_loss_sequence_is_identical_without_agent_with_agent_and_with_a_capture(world):
    env, _ = world
    args = ("--steps", "60", "--seed", "7", "--item-ms", "4", "--print-loss")
    plain_env = {k: v for k, v in env.items()}
    with (
        running(subprocess.Popen(train_cmd(*args), env=plain_env, stdout=subprocess.PIPE,
                                 text=True)) as plain,
        running(gputop_run(train_cmd(*args), env)) as idle,
        running(gputop_run(train_cmd(*args), env)) as captured,
    ):
        wait_for_steps(captured.pid, steps=2)
        reply = client.request(captured.pid, {"cmd": "capture", "steps": 3}, timeout=SLOW)
        assert Path(reply["trace"]).exists()  # so the capture happened mid-run
        outputs = [p.communicate(timeout=SLOW)[0] for p in (plain, idle, captured)]
        assert [p.returncode for p in (plain, idle, captured)] == [0, 0, 0]
    sequences = [_losses(out) for out in outputs]
    assert len(sequences[0]) == 60
    assert sequences[0] == sequences[1] == sequences[2]
