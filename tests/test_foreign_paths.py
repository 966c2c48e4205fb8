"""Issue 55, item 5: paths another user or a shared setup controls.

- an agent whose ``GPUTOP_SOCKET_DIR`` is an existing shared folder (1777, like /tmp) serves in
  it and leaves its mode alone; one anyone may write to without the sticky bit is refused, and
  the job trains on;
- ``gputop analyze`` does not follow a symbolic link another user (uid 65534, a real process of
  that uid makes it) put in a shared folder, to a root-only file;
- replay says why when a recording's ``_snapshots`` is a link or a FIFO.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gputop.client import agents as client
from tests.conftest import SLOW, cli_env, run_cli, wait_for
from tests.scripts.agent_testkit import (
    gputop_run,
    private_agent_world,
    running,
    train_cmd,
    wait_for_steps,
)

NOBODY = 65534
SECRET = "root-only-secret-5e1c"


@pytest.fixture
def shared_dir():
    folder = Path(tempfile.mkdtemp(prefix="gputop-shared-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _agent_job(tmp_path: Path, socket_dir: Path):
    world = private_agent_world(tmp_path / "captures")
    env, _ = world.__enter__()
    env = {**env, "GPUTOP_SOCKET_DIR": str(socket_dir)}
    os.environ["GPUTOP_SOCKET_DIR"] = str(socket_dir)  # the client looks there too
    return world, env


def test_an_existing_shared_socket_dir_keeps_its_mode(tmp_path, shared_dir):
    shared_dir.chmod(0o1777)
    world, env = _agent_job(tmp_path, shared_dir)
    try:
        with running(gputop_run(train_cmd("--steps", "0", "--item-ms", "3"), env)) as proc:
            wait_for_steps(proc.pid, steps=2)
            assert client.find_agent(proc.pid) == shared_dir / f"{proc.pid}.sock"
            assert stat.S_IMODE(shared_dir.stat().st_mode) == 0o1777
    finally:
        world.__exit__(None, None, None)


def test_a_socket_dir_anyone_may_write_without_the_sticky_bit_is_refused(tmp_path, shared_dir):
    shared_dir.chmod(0o777)
    world, env = _agent_job(tmp_path, shared_dir)
    log = tmp_path / "job.err"
    try:
        with open(log, "w") as err:
            proc = gputop_run(train_cmd("--steps", "0", "--item-ms", "3"), env, stderr=err,
                              stdout=subprocess.DEVNULL)
        with running(proc):
            wait_for(lambda: "agent not loaded" in log.read_text(), timeout=SLOW)
            text = log.read_text()
            assert "no sticky bit" in text and "Traceback" not in text, text
            assert proc.poll() is None, "the job goes on without its agent"
            assert not list(shared_dir.glob("*.sock"))
            assert stat.S_IMODE(shared_dir.stat().st_mode) == 0o777
    finally:
        world.__exit__(None, None, None)


def _as_nobody(code: str) -> None:
    drop = f"import os; os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
    done = subprocess.run([sys.executable, "-c", drop + code], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_analyze_does_not_follow_another_users_link(tmp_path, shared_dir):
    shared_dir.chmod(0o1777)  # like /scratch/traces
    secret = tmp_path / "secret.json"  # root's own, 0600
    secret.write_text(json.dumps({"traceEvents": [{"name": SECRET, "ph": "X", "ts": 1,
                                                   "dur": 1}]}))
    secret.chmod(0o600)
    link = shared_dir / "rank0.pt.trace.json"
    _as_nobody(f"os.symlink({str(secret)!r}, {str(link)!r})")
    assert os.lstat(link).st_uid == NOBODY
    for target in (link, shared_dir):  # the file, and the folder that holds it
        done = run_cli("analyze", str(target), env=cli_env())
        assert done.returncode != 0, done.stdout
        assert "symbolic link owned by uid 65534" in done.stderr, done.stderr
        assert SECRET not in done.stdout + done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    # root's own link is followed as before
    own = shared_dir / "own.pt.trace.json"
    own.symlink_to(secret)
    done = run_cli("analyze", str(own), env=cli_env())
    assert "symbolic link" not in done.stderr


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "run"
    done = run_cli("--demo", "throttled", "--interval", "0.5", "record", "-o", str(path),
                   "--duration", "4")
    assert done.returncode == 0, done.stderr
    assert (path / "_snapshots").is_dir()
    return path


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_replay_says_why_snapshots_that_are_not_a_folder_are_not_read(recording, tmp_path,
                                                                        kind):
    copy = tmp_path / "run"
    shutil.copytree(recording, copy)
    moved = tmp_path / "elsewhere"
    shutil.move(copy / "_snapshots", moved)
    if kind == "link":
        (copy / "_snapshots").symlink_to(moved)
    else:
        os.mkfifo(copy / "_snapshots")
    done = run_cli("replay", str(copy), timeout=SLOW)
    assert done.returncode == 0, done.stderr
    word = "a symbolic link" if kind == "link" else "a FIFO"
    assert f"_snapshots is {word}, not a folder of the recording: not read" in done.stderr
    assert "samples rebuilt from its tables" in done.stderr
    assert "Traceback" not in done.stderr
