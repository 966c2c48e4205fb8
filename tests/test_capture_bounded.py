"""The default capture on every kind of real training job: bounded in size and time, harmless
to the job, and still saying where in the code the time goes (py-spy joined to the steps).

Each job is a real CPU torch run of tests/scripts/capture_jobs.py under the real agent
(`gputop run`), captured through the real CLI exactly as a user would:
`gputop capture PID --steps 3 --json`. Step times during and outside the capture are measured
by benchmarks/bench_capture.py on the same jobs, never asserted here.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.client.agents import agent_status
from gputop.core.protocol import JSON_PER_STEP
from tests.conftest import SLOW, run_cli, wait_for
from tests.scripts.agent_testkit import (
    ANSWER_S,
    SCRIPTS,
    gputop_run,
    private_agent_world,
    running,
    wait_for_steps,
)
from tests.test_tui_terminal import start, terminal  # noqa: F401 (the fixture)

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(6 * SLOW)

JOBS = SCRIPTS / "capture_jobs.py"
SOURCE = JOBS.read_text().splitlines()


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(SOURCE, 1) if text in line)


def lines_of(function: str) -> range:
    """The line numbers of a function's body in capture_jobs.py."""
    first = line_of(f"def {function}(")
    last = next((n for n in range(first + 1, len(SOURCE) + 1)
                 if SOURCE[n - 1] and not SOURCE[n - 1].startswith((" ", "\t"))), len(SOURCE))
    return range(first, last)


GETITEM_CALL = line_of("values = decode_sample(index, self.work)")  # in __getitem__


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    captures = tmp_path_factory.mktemp("captures")
    with private_agent_world(captures) as (env, _):
        yield env, captures


def job(env: dict, *args: str):
    return gputop_run([sys.executable, str(JOBS), *args], env)


def capture(pid: int, env: dict, *extra: str, timeout: float = 3 * SLOW):
    return run_cli("capture", str(pid), "--steps", "3", "--json", *extra, env=env,
                   timeout=timeout)


def json_bytes(trace: str) -> int:
    with gzip.open(trace, "rb") as f:
        return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))


def checked(done) -> dict:
    """A capture that finished, with a trace under the documented size."""
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr)
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["capture"]["budget_bytes"] == JSON_PER_STEP * 3
    assert json_bytes(report["trace"]) <= JSON_PER_STEP * 3
    return report


def finding(report: dict, fid: str) -> dict:
    found = next((f for f in report["findings"] if f["id"] == fid), None)
    assert found is not None, [f["id"] for f in report["findings"]]
    return found


def names_getitem(where: str | None) -> None:
    assert where and "__getitem__" in where and f"capture_jobs.py:{GETITEM_CALL}" in where, where


def names_a_getitem_line(where: str | None) -> None:
    """``__getitem__`` and one of its lines, as the line itself or as the call the hottest
    line is under ("_next_state (in PythonDataset.__getitem__, capture_jobs.py:61)"): which
    line of the decoder is hottest in the workers is theirs to measure (on a loaded host,
    turning the values into a tensor can outweigh decoding)."""
    assert where and "__getitem__" in where, where
    lines = [int(n) for n in re.findall(r"capture_jobs\.py:(\d+)", where)]
    assert any(n in lines_of("__getitem__") for n in lines), where


def test_python_heavy_getitem_with_num_workers_0(world):
    env, _ = world
    with running(job(env)) as proc:
        wait_for_steps(proc.pid, steps=3)
        report = checked(capture(proc.pid, env))
        assert report["verdict"] == "dataloader-stall"
        stall = finding(report, "dataloader-stall")
        assert "num_workers=0" in stall["evidence"]
        names_getitem(stall["where"])
        assert "training thread" in stall["where"]
        assert report["capture"]["recorded_steps"] == 3 and report["cut"] == []
        # The same lines are in the report's py-spy section, with the sampled time.
        joined = next(s for s in report["source_lines"] if s["cost"] == "dataloader-stall")
        assert joined["from"] == "py-spy" and joined["sampled_ms"] > 0


def test_python_heavy_getitem_with_two_workers(world):
    env, _ = world
    with running(job(env, "--workers", "2")) as proc:
        wait_for_steps(proc.pid, steps=3)
        report = checked(capture(proc.pid, env))
        stall = finding(report, "dataloader-stall")
        assert report["verdict"] == "dataloader-stall"
        assert "num_workers=0" not in stall["evidence"]
        # The loop only waits on the workers' queue: the line is the workers'.
        names_a_getitem_line(stall["where"])
        assert "DataLoader workers" in stall["where"]


def test_pin_memory(world):
    env, _ = world
    with running(job(env, "--pin-memory")) as proc:
        wait_for_steps(proc.pid, steps=3)
        report = checked(capture(proc.pid, env))
        assert report["verdict"] == "dataloader-stall"
        names_getitem(finding(report, "dataloader-stall")["where"])


def test_model_under_torch_compile(world):
    env, _ = world
    with running(job(env, "--kind", "compile")) as proc:
        wait_for_steps(proc.pid, steps=3, timeout=4 * SLOW)  # compiling takes a while
        report = checked(capture(proc.pid, env))
        assert report["verdict"] == "dataloader-stall"
        names_getitem(finding(report, "dataloader-stall")["where"])


def test_one_step_every_2_s_names_the_logging_code(world):
    env, _ = world
    with running(job(env, "--kind", "slow", "--step-s", "2")) as proc:
        wait_for_steps(proc.pid, steps=2)
        report = checked(capture(proc.pid, env))
        assert report["capture"]["mode"] == "steps"
        assert report["capture"]["recorded_steps"] == 3
        top = finding(report, report["verdict"])
        assert report["verdict"] in ("long-gpu-gaps", "gpu-idle")
        where = top["where"]
        assert where and "log_metrics" in where, where
        line = int(where.split("capture_jobs.py:", 1)[1].split()[0].rstrip("),:"))
        assert line in lines_of("log_metrics")


def test_a_job_that_exits_in_the_middle_of_the_capture(world, tmp_path):
    env, _ = world
    stop = tmp_path / "stop"
    with running(job(env, "--kind", "exits", "--item-ms", "15", "--stop-file", str(stop))) \
            as proc:
        wait_for_steps(proc.pid, steps=2)
        cli = subprocess.Popen(
            [sys.executable, "-m", "gputop", "capture", str(proc.pid), "--steps", "3", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def recording() -> bool:
                status = agent_status(proc.pid, timeout=ANSWER_S) or {}
                capture = status.get("capture") or {}
                return capture.get("state") == "recording" and capture.get("steps_done", 0) >= 1

            wait_for(recording, timeout=SLOW, interval=0.02)
            stop.touch()  # the job ends at its next step, in the middle of the capture
            out, err = cli.communicate(timeout=3 * SLOW)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.communicate()
        assert proc.wait(SLOW) == 0
    warnings = [line for line in err.splitlines() if line.startswith("gputop: warning:")]
    assert len(warnings) == 1, err
    assert "partial trace: the process exited after" in warnings[0]
    assert "of 3 recorded steps" in warnings[0]
    assert "Traceback" not in err
    report = json.loads(out)
    assert json_bytes(report["trace"]) <= JSON_PER_STEP * 3
    assert report["verdict"] == "dataloader-stall"
    names_getitem(finding(report, "dataloader-stall")["where"])


def test_a_job_slower_than_the_deadline_gets_a_time_window_with_a_note(world):
    env, _ = world
    with running(job(env, "--kind", "slow", "--step-s", "3")) as proc:
        wait_for_steps(proc.pid, steps=3)  # the agent knows its step time now
        done = capture(proc.pid, env, "--timeout", "8")
        report = checked(done)
        assert report["capture"]["mode"] == "seconds"
        note = next(n for n in report["notes"] if "time window" in n)
        assert "deadline" in note and "8 s" in note
        assert any("time window" in line for line in done.stderr.splitlines()
                   if line.startswith("gputop: warning:"))
        assert report["metrics"]


def test_with_stack_is_opt_in_and_cut_to_the_budget(world):
    """The profiler's Python tracer on the Python-heavy loader: every call an event. It
    stays opt-in and bounded: the trace is cut to the budget and the report says so."""
    env, _ = world
    # A fixed amount of Python per sample (not the machine-dependent 2 ms): 80 000 calls a
    # step, more trace than the budget of 3 steps.
    with running(job(env, "--batch-size", "4", "--work", "20000")) as proc:
        wait_for_steps(proc.pid, steps=3)
        report = checked(capture(proc.pid, env, "--with-stack", timeout=6 * SLOW))
        # Cut to the size budget, or cut short because the tracer slowed the step; said.
        assert report["cut"] and any("Python frames cut" in c or "Python tracer" in c
                                     for c in report["cut"]), report["cut"]
        assert report["verdict"] == "dataloader-stall"
        # The tracer's own frames still name the source lines (those it kept: the longest).
        traced = [s for s in report["source_lines"] if s.get("from") != "py-spy"]
        assert traced and traced[0]["cost"] == "DataLoader"
        assert any("capture_jobs.py" in line["frame"] for line in traced[0]["lines"])


def test_the_default_records_no_python_tracer_shapes_or_memory(world):
    env, captures = world
    with running(job(env)) as proc:
        wait_for_steps(proc.pid, steps=3)
        report = checked(capture(proc.pid, env, "--no-stacks"))
        with gzip.open(report["trace"], "rt") as f:
            events = json.load(f)["traceEvents"]
        cats = {e.get("cat") for e in events}
        assert "python_function" not in cats
        assert not any(e.get("name") == "[memory]" for e in events)
        assert not any("Input Dims" in (e.get("args") or {}) for e in events)
        assert report["source_lines"] == []  # --no-stacks: no py-spy either
        assert Path(report["trace"]).parent == captures
        assert os.stat(report["trace"]).st_mode & 0o777 == 0o600


def shows(term, *texts: str, interval: float = 0.05) -> str:
    """Wait until the terminal shows every one of ``texts``; the screen when it does (and in
    the failure when it does not)."""
    try:
        wait_for(lambda: all(t in term.capture() for t in texts), timeout=SLOW,
                 interval=interval)
    except AssertionError:
        raise AssertionError(f"not shown: {texts}\n{term.capture()}") from None
    return term.capture()


def test_in_tmux_p_on_the_getitem_job_shows_the_stall_its_line_and_num_workers(world,
                                                                                terminal):  # noqa: F811
    """Acceptance 2: plain `gputop` in a real terminal, `p` on the Python-heavy job (no GPU
    here: the job is a process with the agent). How long the diagnosis took is printed, not
    asserted (benchmarks/bench_capture.py measures captures)."""
    env, _ = world
    with running(job(env)) as proc:
        wait_for_steps(proc.pid, steps=3)
        term = terminal(160, 50, XDG_RUNTIME_DIR=env["XDG_RUNTIME_DIR"],
                        GPUTOP_CAPTURE_DIR=env["GPUTOP_CAPTURE_DIR"])
        monitor = start(term, "")
        shows(term, f"{proc.pid} ", "capture_jobs.py")
        # Other jobs with an agent may be listed (root sees every user's): keep ours alone.
        term.keys("/")
        shows(term, "filter: pid")
        term.tmux("send-keys", "-t", "main", "-l", str(proc.pid))
        term.keys("Enter")
        # "filter kept" is painted once the keys go to the table again: `p` is not typed into
        # the filter box.
        wait_for(lambda: "filter kept" in term.capture()
                 and any("›" in line and f" {proc.pid} " in line  # the selected row
                         for line in term.capture().splitlines()), timeout=SLOW)
        pressed = time.monotonic()
        term.keys("p")
        screen = shows(term, "diagnosis of pid", "Where:", interval=0.1)
        shown = time.monotonic() - pressed
        flat = " ".join(screen.replace("│", " ").split())
        assert f"diagnosis of pid {proc.pid}: dataloader-stall" in flat
        assert "num_workers=0" in flat
        where = flat.split("Where:", 1)[1]
        assert "__getitem__" in where[:200] and f"capture_jobs.py:{GETITEM_CALL}" in where[:200]
        print(f"diagnosis shown {shown:.1f} s after p")
        term.keys("Escape")
        wait_for(lambda: "diagnosis of pid" not in term.capture(), timeout=SLOW)
        term.keys("q")
        monitor.wait(timeout=SLOW)


def test_recording_stops_at_its_time_bound_and_keeps_the_steps(world):
    """40 steps of 2 s would record 80 s: the recording stops at the first step after 30 s,
    the steps so far are analysed, and the cut says why."""
    from gputop.agent.profiling import MAX_RECORD_S

    env, _ = world
    with running(job(env, "--kind", "slow", "--step-s", "2")) as proc:
        wait_for_steps(proc.pid, steps=2)
        done = run_cli("capture", str(proc.pid), "--steps", "40", "--timeout", "300", "--json",
                       env=env, timeout=3 * SLOW)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        recorded = report["capture"]["recorded_steps"]
        assert MAX_RECORD_S / 2 <= recorded < 40
        assert any(f"{40 - recorded} of 40 steps not recorded: the recording reached its "
                   f"{MAX_RECORD_S:g} s limit" in c for c in report["cut"]), report["cut"]
        assert report["metrics"]["steps"]["count"] == recorded
