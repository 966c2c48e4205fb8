"""`gputop run`: the agent in every Python process of a job, never in DataLoader workers;
exit status and signals pass through."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from gputop.client import agents as client
from tests.conftest import REPO, SLOW, run_cli, wait_for
from tests.scripts.agent_testkit import (
    ANSWER_S,
    gputop_run,
    private_agent_world,
    running,
    status_of,
    train_cmd,
    wait_for_steps,
)

# Prints what the agent did in this process, as JSON, then optionally waits.
REPORT = textwrap.dedent(
    """
    import json, os, sys, time
    import gputop.agent as agent
    path = agent.socket_path()
    print(json.dumps({
        "pid": os.getpid(),
        "socket": str(path) if path else None,
        "torch_imported": "torch" in sys.modules,
        "other_site": os.environ.get("OTHER_SITE"),
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
    }), flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with private_agent_world(tmp_path_factory.mktemp("captures")) as (env, _):
        yield env


def test_exit_status_and_pid_are_the_jobs(world):
    result = run_cli("run", "--", sys.executable, "-c", REPORT + "\nsys.exit(5)", env=world)
    assert result.returncode == 5, result.stderr
    report = json.loads(result.stdout)
    assert report["socket"] and report["socket"].endswith(f"/{report['pid']}.sock")
    assert report["torch_imported"] is False  # the agent never imports torch itself
    assert report["sitecustomize"] is None or "agent/boot" in report["sitecustomize"]
    assert result.stderr == ""
    assert not os.path.exists(report["socket"])  # removed at exit


def test_ctrl_c_and_signals_reach_the_job(world):
    script = textwrap.dedent(
        """
        import sys, time
        try:
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(42)
        """
    )
    job = gputop_run([sys.executable, "-c", script], world)
    with running(job):
        assert job.stdout.readline().strip() == "ready"
        wait_for(lambda: client.find_agent(job.pid), timeout=SLOW)  # same pid: gputop exec'd
        job.send_signal(signal.SIGINT)
        assert job.wait(SLOW) == 42
        assert job.stdout.read().strip() == "interrupted"
    job = gputop_run([sys.executable, "-c", script], world)
    with running(job):
        assert job.stdout.readline().strip() == "ready"
        job.send_signal(signal.SIGTERM)
        assert job.wait(SLOW) == -signal.SIGTERM


def test_an_existing_sitecustomize_still_runs(world, tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    env = dict(world, PYTHONPATH=os.pathsep.join([str(tmp_path), world["PYTHONPATH"]]))
    result = run_cli("run", "--", sys.executable, "-c", REPORT, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["other_site"] == "ran"
    assert report["sitecustomize"] == str(tmp_path / "sitecustomize.py")
    assert report["socket"] is not None


def test_every_python_process_of_a_shell_job_gets_the_agent(world):
    one = f"{shlex.quote(sys.executable)} -c {shlex.quote(REPORT)}"
    inner = f"{one} && {one}"
    result = run_cli("run", "--", "sh", "-c", inner, env=world)
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == 2 and all(r["socket"] for r in reports)
    assert reports[0]["pid"] != reports[1]["pid"]


@pytest.mark.parametrize("start_method,workers", [("fork", 2), ("spawn", 1)])
def test_dataloader_workers_never_get_an_agent(world, start_method, workers):
    # (one spawned worker: each one imports torch afresh, seconds on a busy 2-core machine)
    args = (
        "--steps",
        "0",
        "--workers",
        str(workers),
        "--start-method",
        start_method,
        "--item-ms",
        "2",
    )
    job = gputop_run(train_cmd(*args), world)
    with running(job):
        wait_for_steps(job.pid, steps=3)
        children = psutil.Process(job.pid).children(recursive=True)
        assert len(children) >= workers
        agents = client.list_agents()
        assert job.pid in agents
        assert not {c.pid for c in children} & set(agents)
        status = status_of(job.pid)
        assert status["agent_errors"] == 0 and status["steps"] >= 3
        job.terminate()
        _, err = job.communicate(timeout=SLOW)
    # Nothing from the agent. (SIGTERM can catch multiprocessing's resource sharer mid-transfer
    # of a worker's file descriptor and it prints a ConnectionResetError: torch's, not ours.)
    assert "gputop" not in err


def test_torchrun_ranks_each_get_an_agent_with_their_rank(world):
    job = gputop_run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:0",
            "--rdzv-id",
            "job-77",
            *train_cmd("--steps", "0", "--item-ms", "2")[1:],
        ],
        world,
    )
    with running(job):

        def ranks() -> dict[int, dict]:
            found = {}
            for pid in client.list_agents():
                try:
                    hello = client.request(pid, {"cmd": "hello"}, timeout=ANSWER_S)
                except client.AgentError:
                    continue
                if hello.get("rank") is not None and hello.get("job_id") == "torchrun:job-77":
                    status = client.agent_status(pid, timeout=ANSWER_S) or {}
                    if (status.get("steps") or 0) >= 2:
                        found[hello["rank"]] = hello
            return found if len(found) == 2 else {}

        found = wait_for(ranks, timeout=2 * SLOW, interval=0.5)
        assert sorted(found) == [0, 1]
        assert {h["world_size"] for h in found.values()} == {2}
        assert {h["local_rank"] for h in found.values()} == {0, 1}
        rank_pids = {h["pid"] for h in found.values()}
        assert rank_pids <= {p.pid for p in psutil.Process(job.pid).children(recursive=True)}
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=SLOW)
    wait_for(lambda: not rank_pids & set(client.list_agents()), timeout=SLOW)


def test_bad_command_lines_are_one_line_errors(world):
    missing = run_cli("run", env=world)
    assert missing.returncode == 2 and "needs a command" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    unknown = run_cli("run", "--", "no-such-command-xyz", env=world)
    assert unknown.returncode == 127
    assert unknown.stderr.strip() == "gputop: error: command not found: no-such-command-xyz"
    not_exec = run_cli("run", "--", str(REPO / "pyproject.toml"), env=world)
    assert not_exec.returncode == 126 and "not executable" in not_exec.stderr


def test_gputop_agent_0_turns_the_agent_off(world):
    env = dict(world, GPUTOP_AGENT="0")
    result = run_cli("run", "--", sys.executable, "-c", REPORT, env=env)
    assert result.returncode == 0 and json.loads(result.stdout)["socket"] is None


def test_a_job_python_without_gputop_still_gets_the_agent(world, tmp_path):
    # The job's Python may not have gputop installed: the sitecustomize brings its own tree.
    env = {**world, "PYTHONPATH": ""}
    launcher = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from gputop.commands.run import job_environment
        env = job_environment(dict(os.environ))
        assert {str(REPO)!r} not in env["PYTHONPATH"].split(os.pathsep)
        os.execve(sys.executable, [sys.executable, "-c", {REPORT!r}], env)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", launcher],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SLOW,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["socket"] is not None
