"""A capture onto a full disk says so, and leaves nothing open or behind in the trainer."""

from __future__ import annotations

import os

import pytest

from gputop.client import agents as client
from tests.conftest import small_tmpfs, wait_for


@pytest.fixture
def trainer(steady_agent_job):
    wait_for(lambda: (client.agent_status(steady_agent_job.pid) or {}).get("steps"), timeout=120)
    return steady_agent_job


@pytest.fixture
def full_disk(tmp_path):
    """A 96 KiB tmpfs: room for a directory, not for a trace."""
    with small_tmpfs(tmp_path / "full", "96k") as mount:
        yield mount


def deleted_open_files(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith("(deleted)"):
            found.append(target)
    return found


def test_a_full_disk_is_named_and_nothing_stays_open(trainer, full_disk):
    # The trainer's own (torch keeps an anonymous temporary file in /tmp) are not ours.
    before = set(deleted_open_files(trainer.pid))
    for _ in range(3):  # each attempt, not just the first
        with pytest.raises(client.AgentError) as err:
            client.request(trainer.pid, {"cmd": "capture", "steps": 2, "out": str(full_disk),
                                         "record_shapes": True, "with_stack": True},
                           timeout=120)
        assert "no space left" in str(err.value).lower(), str(err.value)
        assert "No such file" not in str(err.value)
    assert os.listdir(full_disk) == []
    assert set(deleted_open_files(trainer.pid)) <= before
    steps = client.agent_status(trainer.pid)["steps"]
    wait_for(lambda: client.agent_status(trainer.pid)["steps"] > steps, timeout=120)
