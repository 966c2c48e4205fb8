"""The agent's socket and protocol, against a real training job started with `gputop run`."""

from __future__ import annotations

import json
import os
import pwd
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from gputop.client import agents as client
from tests.conftest import SLOW
from tests.scripts.agent_testkit import (
    ANSWER_S,
    gputop_run,
    private_agent_world,
    running,
    status_of,
    train_cmd,
    wait_for_steps,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A private socket dir for this module, set for the test process too (the client reads it)."""
    with private_agent_world(
        tmp_path_factory.mktemp("captures"),
        RANK="1", LOCAL_RANK="1", WORLD_SIZE="4", SLURM_JOB_ID="4242",
    ) as world:
        yield world


@pytest.fixture(scope="module")
def job(world):
    env, _runtime = world
    proc = gputop_run(train_cmd("--steps", "0", "--item-ms", "3"), env)
    with running(proc):
        wait_for_steps(proc.pid, steps=3)
        yield proc


def raw_exchange(pid: int, payload: bytes, timeout: float = ANSWER_S) -> list[dict]:
    """Send raw bytes on one connection, read every reply line until the agent closes."""
    path = client.find_agent(pid)
    assert path is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_socket_is_0600_in_a_0700_directory_of_ours(world, job):
    _env, runtime = world
    path = client.find_agent(job.pid)
    assert path == runtime / "gputop" / f"{job.pid}.sock"
    st, dst = os.lstat(path), os.lstat(path.parent)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_ISDIR(dst.st_mode) and stat.S_IMODE(dst.st_mode) == 0o700
    assert st.st_uid == dst.st_uid == os.geteuid()
    assert client.list_agents()[job.pid] == path


def test_hello_describes_the_process(job):
    hello = client.request(job.pid, {"cmd": "hello"}, timeout=ANSWER_S)
    assert hello["pid"] == job.pid  # gputop run exec'd: the job has gputop's pid
    assert hello["argv"][0].endswith("slow_loader_train.py")
    assert hello["hostname"] == socket.gethostname()
    assert (hello["rank"], hello["local_rank"], hello["world_size"]) == (1, 1, 4)
    assert hello["job_id"] == "slurm:4242"
    import torch

    assert hello["torch_version"] == torch.__version__
    # Known without touching CUDA: False with a CPU build of torch; with a CUDA build, unknown
    # (None) in a job that has not initialised CUDA itself, whatever GPUs this host has.
    cpu_build = torch.version.cuda is None and torch.version.hip is None
    assert hello["cuda_available"] is (False if cpu_build else None)
    assert hello["agent_version"] and hello["protocol"] == client.PROTOCOL_VERSION
    assert abs(hello["start_time"] - time.time()) < 600


def test_status_has_step_rate_and_dataloader_share(job):
    status = status_of(job.pid)
    assert status["steps"] >= 3
    assert status["steps_per_s"] > 0
    assert 0 < status["step_time_p50_s"] <= status["step_time_p95_s"]
    # 8 samples x 3 ms of loader time against a tiny model: the loader dominates.
    assert status["dataloader_wait_share"] > 0.5
    assert status["capture"]["state"] == "idle"
    assert status["agent_errors"] == 0 and status["step_hook"] is True
    # The rank too: the exporter labels a job's series with it (never with the pid).
    assert (status["rank"], status["local_rank"], status["world_size"]) == (1, 1, 4)


def test_bad_requests_get_error_replies_and_the_agent_stays_up(job):
    replies = raw_exchange(
        job.pid,
        b"not json\n"
        b"[1, 2]\n"
        b'{"no": "cmd"}\n'
        b'{"cmd": "reboot"}\n'
        b'{"cmd": "hello", "extra": 1}\n'
        b'{"cmd": "capture", "steps": "three"}\n'
        b'{"cmd": "capture", "steps": 3, "seconds": 1}\n'
        b'{"cmd": "capture", "out": "relative/dir"}\n'
        b"\xff\xfe\n"
        b'{"cmd": "status"}\n',
    )
    codes = [r.get("error") for r in replies]
    assert codes == [
        "bad-request",
        "bad-request",
        "bad-request",
        "unknown-command",
        "bad-request",
        "bad-request",
        "bad-request",
        "bad-request",
        "bad-request",
        None,
    ]
    assert all(r["ok"] is False and r["message"] for r in replies[:-1])
    assert replies[-1]["ok"] is True and replies[-1]["steps"] >= 3
    assert client.request(job.pid, {"cmd": "hello"}, timeout=ANSWER_S)["pid"] == job.pid


def test_oversized_message_is_refused_and_the_connection_closed(job):
    replies = raw_exchange(job.pid, b'{"cmd": "hello", "x": "' + b"a" * (70 * 1024) + b'"}\n')
    assert [r["error"] for r in replies] == ["too-large"]
    assert client.request(job.pid, {"cmd": "hello"}, timeout=ANSWER_S)["pid"] == job.pid


def test_cancel_without_capture_is_a_no_op(job):
    assert client.request(job.pid, {"cmd": "cancel"}, timeout=ANSWER_S) == {
        "ok": True, "cancelled": False}


def _nobody_client(socket_path: Path) -> dict:
    """In a forked child that became `nobody`: connect, say hello, return what happened."""
    assert os.geteuid() != 0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(ANSWER_S)
    try:
        s.connect(str(socket_path))
    except PermissionError:
        return {"connect": "EACCES"}
    data = b""
    try:
        s.sendall(b'{"cmd": "hello"}\n')
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return {"connect": "ok", "received": data.decode(errors="replace")}


def _as_nobody(socket_path: Path) -> dict:
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            os.close(read_end)
            os.setgid(pwd.getpwnam("nobody").pw_gid)
            os.setuid(pwd.getpwnam("nobody").pw_uid)
            os.write(write_end, json.dumps(_nobody_client(socket_path)).encode())
            status = 0
        except BaseException as exc:
            os.write(write_end, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        out = f.read()
    _, status = os.waitpid(child, 0)
    result = json.loads(out)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become `nobody`")
def test_peer_of_another_uid_is_refused(world, job):
    _env, runtime = world
    path = client.find_agent(job.pid)
    # First line of defence: the 0700 directory keeps other users from reaching the socket.
    assert _as_nobody(path)["connect"] == "EACCES"
    # Loosen every file mode: SO_PEERCRED still refuses the peer.
    before = status_of(job.pid)["refused_peers"]
    modes = [(p, stat.S_IMODE(os.lstat(p).st_mode)) for p in (runtime, path.parent, path)]
    try:
        os.chmod(runtime, 0o711)
        os.chmod(path.parent, 0o711)
        os.chmod(path, 0o666)
        outcome = _as_nobody(path)
    finally:
        for p, mode in modes:
            os.chmod(p, mode)
    assert outcome == {"connect": "ok", "received": ""}  # closed unanswered: nothing leaks
    assert status_of(job.pid)["refused_peers"] == before + 1
    assert client.request(job.pid, {"cmd": "hello"}, timeout=ANSWER_S)["pid"] == job.pid


def in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except Exception as exc:  # handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def test_status_of_a_dead_or_hung_agent_is_none_not_a_hang(world):
    _env, runtime = world
    directory = client.socket_dir(create=True)
    # A hung agent: the socket listens but nobody ever answers.
    hung_pid = os.getpid()
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(directory / f"{hung_pid}.sock"))
    hung.listen(1)
    try:
        # Nobody will ever answer: the call returns only because its timeout is kept. (How
        # long that takes is for benchmarks/bench_agent.py to measure; a hang fails here.)
        thread, box = in_thread(client.agent_status, hung_pid, timeout=0.3)
        thread.join(SLOW)
        assert not thread.is_alive(), "agent_status() hung on an agent that never answers"
        assert box == {"value": None}
        with pytest.raises(client.AgentError) as err:
            client.request(hung_pid, {"cmd": "status"}, timeout=0.3)
        assert err.value.code == "timeout" and "\n" not in str(err.value)
    finally:
        hung.close()
    # The same file, no longer listening: refused, so stale, so removed.
    with pytest.raises(client.AgentError) as err:
        client.request(hung_pid, {"cmd": "status"})
    assert err.value.code == "no-agent"
    assert not (directory / f"{hung_pid}.sock").exists()


def test_list_agents_removes_sockets_of_dead_processes(world, spawn):
    directory = client.socket_dir(create=True)
    dead = spawn([sys.executable, "-c", "pass"])
    dead.wait(SLOW)
    stale = directory / f"{dead.pid}.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    assert stale.exists()
    assert dead.pid not in client.list_agents()
    assert not stale.exists()
    assert client.agent_status(dead.pid) is None
    with pytest.raises(client.AgentError, match=f"no process with pid {dead.pid}"):
        client.request(dead.pid, {"cmd": "hello"})


def test_socket_dir_prefers_a_private_xdg_runtime_dir(tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert client.socket_dir(create=True) == xdg / "gputop"
    assert stat.S_IMODE(os.lstat(xdg / "gputop").st_mode) == 0o700
    # Not private: not usable for sockets, fall back to /tmp/gputop-<uid>.
    os.chmod(xdg, 0o755)
    assert client.socket_dir() == Path("/tmp") / f"gputop-{os.geteuid()}"


def test_socket_dir_refuses_a_symlink_or_a_foreign_owner(tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (xdg / "gputop").symlink_to(elsewhere)
    with pytest.raises(client.AgentError, match="symlink"):
        client.socket_dir(create=True)
    (xdg / "gputop").unlink()
    (xdg / "gputop").mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(xdg / "gputop", pwd.getpwnam("nobody").pw_uid, -1)
        with pytest.raises(client.AgentError, match="owned by uid"):
            client.socket_dir(create=True)
        assert client.list_agents() is not None  # refused quietly on the discovery side


def test_a_socket_answering_in_another_process_name_is_not_trusted(world, spawn):
    directory = client.socket_dir(create=True)
    victim = spawn(["sleep", "600"])
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(str(directory / f"{victim.pid}.sock"))
    impostor.listen(1)
    try:
        with pytest.raises(client.AgentError) as err:
            client.request(victim.pid, {"cmd": "status"})
        assert err.value.code == "refused"
        assert f"served by pid {os.getpid()}" in str(err.value)
        assert client.agent_status(victim.pid) is None
    finally:
        impostor.close()
        os.unlink(directory / f"{victim.pid}.sock")
