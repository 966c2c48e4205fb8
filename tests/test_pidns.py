"""Pid namespaces both ways (issue 29, acceptance 1), all real: a torch training job with the
agent runs in a new pid namespace (`unshare --pid --fork --mount-proc`, as a container does);
the simulated driver reports its host pid on a GPU, as NVML would.

* gputop outside (the host's namespace) names it with both pids, finds its agent under
  /proc/PID/root and tells it its host pid;
* gputop in another new pid namespace (it sees only itself; /tmp is shared) says in one line
  why it cannot name the job while nothing has told the agent its host pid, and names it,
  with both pids and the agent's telemetry, once the host's gputop has;
* gputop in the job's own namespace (`kubectl exec`: here nsenter) names it by its pid there,
  with its host pid;
* `p` (`gputop capture`, and the live monitor's `p`) captures it from each of them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputop.collect.pidmap import PidResolver
from gputop.core.agent_status import parse_status
from gputop.core.pidns import device_holders, eliminate, nspids
from tests.conftest import REPO, SLOW, wait_for
from tests.scripts.agent_testkit import agent_env, private_runtime_dir

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(8 * SLOW)
TRAIN = REPO / "tests" / "scripts" / "steady_train.py"
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "needs unshare(1)"
    done = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"unshare --pid is not permitted here: {done.stderr.strip()[:200]}"
    return None


@pytest.fixture
def ns_world(tmp_path):
    """The environment every process of the test shares: a private agent socket directory
    and capture directory (on the filesystem all the namespaces see)."""
    why = _unshare_works()
    if why:
        pytest.skip(why)
    runtime = private_runtime_dir()
    env = agent_env(runtime, tmp_path / "captures", OMP_NUM_THREADS="1")
    yield env
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def ns_job(spawn, ns_world):
    """(host pid, env): the training job, pid 1 of its own pid namespace."""
    job = spawn([*UNSHARE, sys.executable, "-m", "gputop", "run", "--", sys.executable,
                 str(TRAIN), "--seconds", "600", "--step-ms", "20"],
                env=ns_world, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert job.stdout.readline().strip() == "training"
    host = psutil.Process(job.pid).children()[0].pid
    assert nspids(host) == (host, 1)
    return host, ns_world


def gputop(env, *args: str, namespace: list[str] | None = None, demo_pid: int | None = None,
           timeout: float = SLOW) -> subprocess.CompletedProcess:
    """`gputop ARGS` on the host, or run under ``namespace`` (a command prefix)."""
    if demo_pid is not None:
        env = {**env, "GPUTOP_DEMO_PIDS": f"0:{demo_pid}"}
    return subprocess.run([*(namespace or []), sys.executable, "-m", "gputop", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


def snapshot(env, host: int, namespace: list[str] | None = None) -> dict:
    # `memory-leak`: one simulated H100, whose process is the job (its host pid, as NVML).
    done = gputop(env, "--demo", "memory-leak", "snapshot", "--json", namespace=namespace,
                  demo_pid=host)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["gpus"][0]["processes"][0]


def capture(env, pid: int, namespace: list[str] | None = None) -> dict:
    done = gputop(env, "capture", str(pid), "--steps", "2", "--json", namespace=namespace,
                  timeout=2 * SLOW)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_host_sibling_and_own_namespace_name_the_job_and_capture_it(ns_job):
    host, env = ns_job

    # Beside the job: nothing has told its agent its host pid yet, so one line says why.
    before = snapshot(env, host, namespace=UNSHARE)
    assert before["pid"] == host and before["visible"] is False
    assert "agent" not in before
    assert len(before["hidden"].splitlines()) == 1
    assert f"host pid {host}" in before["hidden"] and "pid namespace" in before["hidden"]
    text = gputop(env, "--demo", "memory-leak", "snapshot", namespace=UNSHARE, demo_pid=host)
    assert f"host pid {host} runs outside this pid namespace" in text.stdout

    # On the host: both pids, the agent (found in the job's namespace), its owner unknown.
    on_host = snapshot(env, host)
    assert on_host["pid"] == host and on_host["ns_pid"] == 1 and on_host["visible"]
    assert "steady_train.py" in on_host["cmdline"]
    assert on_host["agent"]["pid"] == 1 and on_host["agent"]["pidns"] > 0
    text = gputop(env, "--demo", "memory-leak", "snapshot", demo_pid=host).stdout
    assert "container pid 1" in text

    # Beside the job again: its agent now knows its host pid (the host's gputop said it).
    def named_beside() -> dict | None:
        proc = snapshot(env, host, namespace=UNSHARE)
        return proc if proc.get("agent") else None

    beside = wait_for(named_beside, timeout=SLOW, interval=1)
    assert beside["pid"] == host and beside["ns_pid"] == 1 and beside["visible"] is False
    assert beside["agent"]["host_pid"] == host
    assert beside["agent"]["host_pid_source"] == "monitor"
    assert "steady_train.py" in beside["cmdline"]

    # In the job's own namespace (kubectl exec): its pid there, with its host pid.
    inside_ns = ["nsenter", "-t", str(host), "-p", "-m"]
    probe = subprocess.run([*inside_ns, "true"], capture_output=True)
    if probe.returncode == 0:
        inside = snapshot(env, host, namespace=inside_ns)
        assert inside["pid"] == 1 and inside["host_pid"] == host and inside["visible"]
        assert inside["agent"]["pid"] == 1
        assert Path(capture(env, 1, namespace=inside_ns)["trace"]).name.endswith(".json.gz")

    # `p` from the host (the trace through the job's root) and from beside it.
    from_host = capture(env, host)
    assert from_host["trace"].startswith(f"/proc/{host}/root/")
    assert from_host["verdict"]
    from_beside = capture(env, host, namespace=UNSHARE)
    assert Path(from_beside["trace"]).exists() and from_beside["verdict"]


def test_p_in_the_live_monitor_captures_the_namespaced_job(ns_job, monkeypatch):
    """The live monitor on the host: the job's row shows its container pid, and `p` on it
    captures through the agent's socket in the job's namespace."""
    from gputop.tui.monitor.app import GputopApp
    from gputop.tui.screens.diagnosis_screen import DiagnosisScreen
    from tests.tui_data import screen_text

    host, env = ns_job
    for key in ("XDG_RUNTIME_DIR", "GPUTOP_CAPTURE_DIR", "XDG_STATE_HOME", "GPUTOP_SOCKET_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("GPUTOP_DEMO_PIDS", f"0:{host}")

    async def run() -> None:
        app = GputopApp(demo="memory-leak", interval=0.5)
        async with app.run_test(size=(160, 40)) as pilot:
            async def until(condition, timeout: float = SLOW) -> None:
                deadline = time.monotonic() + timeout
                while not condition():
                    assert time.monotonic() < deadline, screen_text(app)
                    await pilot.pause(0.1)

            await until(lambda: str(host) in app.table.rows)
            await until(lambda: "container pid 1" in
                        app.table.get_cell(str(host), "command").plain)
            assert app.table.selected_row().pid == host
            await pilot.press("p")
            await until(lambda: isinstance(app.screen, DiagnosisScreen), timeout=2 * SLOW)
            assert app.screen.pid == host
            assert app.screen.trace.startswith(f"/proc/{host}/root/")
            await pilot.press("escape")
            await pilot.press("q")

    asyncio.run(run())


# -- the mapping's parts --------------------------------------------------------------------


def test_elimination_matches_one_host_pid_to_one_holder_per_gpu():
    # Rank 1 also holds GPU 0 (a context torch made there): matched on GPU 1 first, it is no
    # longer a candidate on GPU 0, where the leftover pair is rank 0.
    host_pids = {0: [9000, 9001], 1: [9001]}
    holders = {0: {10, 11}, 1: {11}}
    assert eliminate(host_pids, holders, {}) == {9001: 11, 9000: 10}
    # Two unknowns sharing a GPU with nothing else to tell them apart: no guess.
    assert eliminate({0: [9000, 9001]}, {0: {10, 11}}, {}) == {}
    # A process of another container on the GPU (not held here): no guess either.
    assert eliminate({0: [9000, 9001]}, {0: {10}}, {}) == {}


def test_device_holders_are_read_from_real_fd_tables(tmp_path, spawn):
    """The scan reads the processes' fd tables: a process holding the device file (here a
    stand-in path for /dev/nvidia3) is found, another is not."""
    device = tmp_path / "nvidia3"
    device.write_text("")
    code = f"f = open({str(device)!r}); print('ready', flush=True); import time; time.sleep(600)"
    holder = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    other = spawn([sys.executable, "-c", "print('ready', flush=True); import time; "
                   "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready" == other.stdout.readline().strip()
    found = device_holders([3, 4], prefix=str(tmp_path / "nvidia"),
                           pids=[holder.pid, other.pid])
    assert found == {3: {holder.pid}, 4: set()}


def test_resolver_uses_the_agents_host_pids_then_elimination():
    calls = []

    def holders(minors):
        calls.append(list(minors))
        return {0: {21}, 1: {22}}

    resolver = PidResolver(holders=holders)
    agents = {20: parse_status({"pid": 20, "host_pid": 5000}),  # an agent here, its host pid
              5003: parse_status({"pid": 1, "host_pid": 5003})}  # another namespace's, by host pid
    out = resolver.resolve({0: [5000, 5001], 1: [5002], 2: [5003, 5004]}, {0: 0, 1: 1},
                           agents, alive=lambda pid: True)
    assert out[5000].local == 20
    assert out[5003].agent is agents[5003]
    assert out[5002].local == 22  # the only holder of GPU 1's device file
    assert out[5001].local == 21  # GPU 0's leftover pair, once 5000 is known
    assert out[5004].hidden and "host pid 5004" in out[5004].hidden
    assert calls == [[0, 1]]
    # The device files are scanned again only after HOLDERS_EVERY_S; matches are kept.
    again = resolver.resolve({0: [5000, 5001], 1: [5002]}, {0: 0, 1: 1},
                             {20: agents[20]}, alive=lambda pid: True)
    assert again[5001].local == 21 and len(calls) == 1
