"""Memory captures and out-of-memory reports on real CPU training jobs with the real agent
(`gputop run`), through the real command line: `gputop memory PID --steps 3 --json` names the
line that grows and its bytes per step; an activation-heavy job's peak is mostly activations;
a real allocation failure (an address-space limit the job sets itself) and a raised
torch.OutOfMemoryError leave a report `gputop memory --last-oom` reads after the job died."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SLOW, run_cli
from tests.scripts.agent_testkit import gputop_run, private_agent_world, running, wait_for_steps

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(6 * SLOW)

JOBS = REPO / "tests" / "scripts" / "memory_jobs.py"
sys.path.insert(0, str(JOBS.parent))
from memory_jobs import APPEND_LINE  # noqa: E402

MIB = 1 << 20


@pytest.fixture
def world(tmp_path):
    with private_agent_world(tmp_path / "captures", OMP_NUM_THREADS="1") as (env, _runtime):
        yield env, tmp_path / "captures"


def job(env: dict[str, str], *args: str) -> subprocess.Popen:
    proc = gputop_run([sys.executable, str(JOBS), *args], env)
    assert proc.stdout.readline().strip() == "training", proc.stderr.read()
    return proc


def memory(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_cli("memory", *args, env=env, timeout=2 * SLOW)


def test_growth_names_the_appending_line_and_the_bytes_per_step(world):
    """Acceptance 1: a job that appends a new 1 MiB tensor to a list every step."""
    env, captures = world
    with running(job(env, "grow", "--grow-mib", "1")) as proc:
        wait_for_steps(proc.pid, 5)
        done = memory(str(proc.pid), "--steps", "3", "--json", env=env)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert proc.poll() is None  # the job trains on
    assert report["kind"] == "capture" and report["pid"] == proc.pid
    assert report["device"] == "cpu" and report["source"] == "profiler"
    top = report["growth"][0]
    assert Path(top["file"]) == JOBS and top["line"] == APPEND_LINE, top
    assert top["function"] == "keep" and "history.append" in top["code"]
    assert top["bytes_per_step"] == MIB  # exactly: one float32 tensor of 262,144 elements
    assert top["count"] == report["steps"] and top["bytes"] == report["steps"] * MIB
    assert top["steady"] is True
    assert "global `history` of memory_jobs.py" in top["kept_by"]
    assert 1 <= report["steps"] <= 3  # a busy machine may end the tracer's recording early
    assert report["verdicts"][0]["id"] == "growth"
    path = Path(report["report"])
    assert path.parent == captures and path.name.endswith(".memory.json")
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_text_report_says_where_and_what_keeps_it(world):
    env, _ = world
    with running(job(env, "grow", "--grow-mib", "0.5")) as proc:
        wait_for_steps(proc.pid, 5)
        done = memory(str(proc.pid), env=env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"Memory of pid {proc.pid}" in text
    assert f"+512 KiB/step  memory_jobs.py:{APPEND_LINE} keep" in text
    assert "kept by: a list of" in text and "global `history` of memory_jobs.py" in text
    assert "Peak of step" in text and "CPU allocator does not cache" in text


def test_an_activation_heavy_peak_is_mostly_activations(world):
    """Acceptance 2: a deep narrow MLP on a large batch."""
    env, _ = world
    with running(job(env, "activations")) as proc:
        wait_for_steps(proc.pid, 5)
        done = memory(str(proc.pid), "--steps", "3", "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    parts = report["peak"]["parts"]
    assert max(parts, key=parts.get) == "activations", parts
    # 12 layers of 4096 x 64 float32 outputs are saved for the backward pass: 12 MiB and more.
    assert parts["activations"] >= 12 * MIB
    assert parts["parameters"] == 12 * (64 * 64 + 64) * 4
    assert parts["optimizer_state"] >= 2 * parts["parameters"]  # Adam's two moments
    assert report["growth"] == []
    assert any(v["id"] == "activations" and "checkpoint" in v["fix"]
               for v in report["verdicts"])
    lines = report["peak"]["activation_lines"]
    assert lines and Path(lines[0]["file"]) == JOBS


def test_a_real_allocation_failure_leaves_a_report_that_last_oom_reads(world):
    """Acceptance 3 without CUDA: the job limits its own address space (RLIMIT_AS) and keeps
    16 MiB a step until the CPU allocator fails for real; the agent sees the error end the job
    (the same report path the CUDA observer takes) and writes its report first."""
    env, captures = world
    proc = gputop_run([sys.executable, str(JOBS), "oom", "--grow-mib", "16",
                       "--step-ms", "10"], env)
    with running(proc):
        _, stderr = proc.communicate(timeout=2 * SLOW)
    assert proc.returncode == 1
    assert "DefaultCPUAllocator: can't allocate memory" in stderr  # the job's own traceback
    done = memory("--last-oom", str(proc.pid), env=env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"Out of memory in pid {proc.pid} on cpu" in text and "RuntimeError" in text
    assert "asked for 16.0 MiB" in text
    assert f"at memory_jobs.py:{APPEND_LINE} keep: history.append(" in text
    assert "global `history` of memory_jobs.py" in text  # what held the memory
    assert "limit (RLIMIT_AS)" in text
    report = json.loads(memory("--last-oom", str(proc.pid), "--json", env=env).stdout)
    assert report["kind"] == "oom" and report["oom"]["fatal"] is True
    assert report["oom"]["requested"] == 16 * MIB
    assert report["oom"]["where"]["line"] == APPEND_LINE
    held = report["census"]["held_by"][0]
    assert "history" in held["what"] and held["bytes"] >= 16 * MIB
    (path,) = captures.glob(f"*_{proc.pid}.*.oom.json")
    assert report["report"] == str(path)
    # The report file itself, as `--last-oom FILE`.
    again = memory("--last-oom", str(path), "--json", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["pid"] == proc.pid


def test_a_raised_out_of_memory_error_is_reported(world):
    """Acceptance 3 as written: a job that raises torch.OutOfMemoryError (uncaught)."""
    env, _ = world
    proc = gputop_run([sys.executable, str(JOBS), "raise-oom", "--step-ms", "5"], env)
    with running(proc):
        _, stderr = proc.communicate(timeout=2 * SLOW)
    assert proc.returncode == 1 and "OutOfMemoryError" in stderr
    done = memory("--last-oom", str(proc.pid), "--json", env=env)
    assert done.returncode == 0, done.stderr
    oom = json.loads(done.stdout)["oom"]
    assert oom["exception"] == "OutOfMemoryError" and oom["requested"] == 2 << 30
    assert oom["step"] == 20 and oom["where"]["function"] == "main"


def test_memory_requests_are_checked_and_one_capture_runs_at_a_time(world):
    from gputop.client.agents import AgentConnection
    from tests.scripts.agent_testkit import ANSWER_S

    env, _ = world
    with running(job(env, "grow", "--grow-mib", "0.25", "--step-ms", "400")) as proc:
        wait_for_steps(proc.pid, 2)
        for bad, word in (({"steps": 0}, "steps"), ({"steps": "3"}, "steps"),
                          ({"timeout": -1}, "timeout"), ({"out": "relative"}, "out"),
                          ({"shutdown": True}, "unknown field")):
            with AgentConnection(proc.pid, ANSWER_S) as conn:
                conn.send({"cmd": "memory", **bad})
                reply = conn.receive(ANSWER_S)
            assert reply["ok"] is False and reply["error"] == "bad-request", reply
            assert word in reply["message"]
        # A profiler capture holds the job: a memory capture is told so, and the other way.
        trace = subprocess.Popen([sys.executable, "-m", "gputop", "capture", str(proc.pid),
                                  "--steps", "3", "--no-stacks", "--json"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=REPO)
        with running(trace):
            from tests.conftest import wait_for
            from tests.scripts.agent_testkit import status_of

            wait_for(lambda: status_of(proc.pid)["capture"].get("state") not in (None, "idle"),
                     timeout=SLOW)
            busy = memory(str(proc.pid), env=env)
            assert busy.returncode == 1 and "already running" in busy.stderr
            assert len(busy.stderr.strip().splitlines()) <= 2  # progress line + the error
            trace.communicate(timeout=2 * SLOW)
        with AgentConnection(proc.pid, 2 * SLOW) as conn:
            conn.send({"cmd": "memory", "steps": 2, "timeout": 60})
            wait_for(lambda: status_of(proc.pid)["capture"].get("kind") == "memory",
                     timeout=SLOW)
            other = run_cli("capture", str(proc.pid), "--no-stacks", env=env, timeout=SLOW)
            assert other.returncode == 1 and "memory capture is already running" in other.stderr
            reply = conn.receive(2 * SLOW)
        assert reply["ok"] is True and reply["recorded_steps"] >= 1


def test_no_agent_and_usage_errors_are_one_line(world, spawn):
    env, _ = world
    plain = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    for args, code in (((str(plain.pid),), 1), (("notapid",), 2), ((), 2),
                       ((str(plain.pid), "--steps", "0"), 2),
                       ((str(plain.pid), "--last-oom", "1"), 2)):
        done = memory(*args, env=env)
        assert done.returncode == code, (args, done.stderr)
        lines = [x for x in done.stderr.splitlines() if x.startswith("gputop: error")]
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "gputop run" in memory(str(plain.pid), env=env).stderr


def test_last_oom_refuses_bad_files_in_one_line(world, tmp_path):
    env, _ = world
    good = {"format": "gputop-memory", "version": 1, "kind": "oom", "pid": 42, "time": 1.0,
            "device": "cpu", "source": "process",
            "oom": {"requested": 1, "message": "boom", "step": 1,
                    "where": {"file": "/x/train.py", "line": 3, "function": "f",
                              "code": "x = y\x1b[2J\u202e"}}}
    cases = {
        "not-json.json": b"\x00\x01 not json",
        "wrong-type.json": json.dumps({**good, "pid": "42"}).encode(),
        "long-list.json": json.dumps({**good, "notes": ["n"] * 17}).encode(),
        "long-text.json": json.dumps({**good, "host": "h" * 401}).encode(),
        "other-format.json": json.dumps({**good, "format": "something"}).encode(),
        "capture.json": json.dumps({**good, "kind": "capture"}).encode(),
        "huge.json": b" " * ((1 << 20) + 1),
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        done = memory("--last-oom", str(path), env=env)
        assert done.returncode == 1, (name, done.stdout)
        assert done.stdout == "" and "Traceback" not in done.stderr, name
        assert len(done.stderr.strip().splitlines()) == 1, (name, done.stderr)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for target in (str(fifo), str(tmp_path), str(tmp_path / "missing.json"), "999999999"):
        done = memory("--last-oom", target, env=env)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, target
    # A well-formed report's text is shown with its control characters escaped.
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(good))
    done = memory("--last-oom", str(path), env=env)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout
    assert "x = y\\x1b[2J\\u202e" in done.stdout
    raw = memory("--last-oom", str(path), "--json", env=env).stdout
    assert "\u202e" not in raw and json.loads(raw)["oom"]["where"]["code"].endswith("\u202e")
