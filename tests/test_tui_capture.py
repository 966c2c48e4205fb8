"""Captures from the live monitor, all real: the input-starved demo's torch training loop with
the agent, real sockets, real traces; and a job with the agent that never steps."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputop.client.agents import AgentError, agent_status, list_agents, request_capture
from gputop.core.model import ProcSample
from gputop.tui.monitor.app import GputopApp
from gputop.tui.screens.diagnosis_screen import DiagnosisScreen
from gputop.tui.view.severity import SEVERITY_MARK
from tests.conftest import SLOW, cli_env, wait_for
from tests.scripts.agent_testkit import ANSWER_S, private_runtime_dir
from tests.tui_data import run_async, scenario_snapshots, screen_text, until, with_process

pytest.importorskip("torch")
# Generous: each test waits on a few things (torch imports, a capture) of up to SLOW each.
pytestmark = pytest.mark.timeout(5 * SLOW)






@pytest.fixture
def agents_here(monkeypatch, tmp_path):
    """A private agent socket directory and capture directory, inherited by the demo's
    training process and any job the test starts."""
    runtime = private_runtime_dir()
    captures = tmp_path / "captures"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("GPUTOP_CAPTURE_DIR", str(captures))
    yield captures
    shutil.rmtree(runtime, ignore_errors=True)


def stall_of(app):
    return next((f for f in app.findings.findings if f.id == "dataloader-stall"), None)


@run_async
async def test_demo_stall_shows_in_the_panel_and_p_shows_the_diagnosis(agents_here):
    """Acceptance 2 under the pilot: the stall shows (how soon is measured by
    benchmarks/bench_findings.py), then `p` on the training process gives the diagnosis screen
    with dataloader-stall and the trace."""
    app = GputopApp(demo="input-starved", interval=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frames_rendered > 0)
        await until(pilot, lambda: stall_of(app) is not None)
        stall = stall_of(app)
        # The panel is laid out again for a finding that raises: on the next frames.
        await until(pilot, lambda: "dataloader-stall" in screen_text(app)
                    and "fix:" in app.findings.text.plain)
        assert app.gpu_panel.mark_of(0) == stall.severity
        command = app.table.get_cell(str(stall.pid), "command").plain.strip()
        assert command.startswith(SEVERITY_MARK[stall.severity] + " ")
        # The training process is on GPU 0: the first row, where the cursor starts.
        assert app.table.selected_row().pid == stall.pid
        # On a cold start torch may still be importing when the stall shows (the rule sees
        # the busy process without the agent's telemetry): `p` needs the agent listening.
        await until(pilot, lambda: stall.pid in list_agents())
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, DiagnosisScreen))
        screen = app.screen
        trace = Path(screen.trace)
        assert trace.exists() and trace.parent == agents_here
        assert screen.pid == stall.pid and screen.analysis.verdict == "dataloader-stall"
        await pilot.pause()
        text = screen_text(app)
        assert f"diagnosis of pid {stall.pid}: dataloader-stall" in text
        flat = " ".join(text.replace("│", " ").split())  # a long path goes on a line of its own
        assert f"trace: {trace}" in flat and "ui.perfetto.dev" in text
        assert "Where the step time went" in text and "Fix:" in text
        assert not app.capture_line.display  # the progress line is gone
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DiagnosisScreen))
        await pilot.press("q")


@run_async
async def test_auto_capture_attaches_verdict_and_trace_to_the_finding(agents_here):
    app = GputopApp(demo="input-starved", interval=0.5, auto_capture=True)
    async with app.run_test(size=(120, 40)) as pilot:
        def noted():
            stall = stall_of(app)
            note = app.capture_notes.get((stall.id, stall.gpu, stall.pid)) if stall else None
            return note is not None and note != "capture: running…"

        await until(pilot, noted, timeout=2 * SLOW)
        stall = stall_of(app)
        note = app.capture_notes[(stall.id, stall.gpu, stall.pid)]
        assert note.startswith("capture: dataloader-stall, trace ")
        # The list marks the captured finding; selected, it shows the note in full.
        assert "capture: dataloader-stall" in app.findings.text.plain.splitlines()[
            app.findings.findings.index(stall)]
        app.findings.select(app.findings.findings.index(stall))
        # Wrapped to the panel's width: compared word by word.
        await until(pilot, lambda: " ".join(note.split())
                    in " ".join(app.findings.text.plain.split()))
        trace = Path(note.split(", trace ", 1)[1])
        assert trace.exists() and trace.parent == agents_here
        assert stall.pid in app.auto_capture.last_capture
        assert not isinstance(app.screen, DiagnosisScreen)  # it does not take over the screen
        await pilot.pause()
        assert "capture: dataloader-stall" in screen_text(app)
        assert len(list(agents_here.iterdir())) == 1 and not app.captures
        await pilot.press("q")


@pytest.fixture
def idle_job(agents_here, spawn):
    """A process with torch and the agent that never takes an optimizer step."""
    job = spawn(
        [sys.executable, "-c", "import torch, gputop.agent, time; gputop.agent.install(); "
         "print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env=cli_env())
    assert job.stdout.readline().strip() == "ready"
    wait_for(lambda: job.pid in list_agents(), timeout=SLOW)
    return job


@run_async
async def test_p_shows_progress_then_a_one_line_error_when_no_step_comes(idle_job):
    """No step comes: the capture records a time window instead, in which an idle process
    runs no torch operator; that is said in one line."""
    ps = psutil.Process(idle_job.pid)
    proc = ProcSample(pid=idle_job.pid, name="python", cpu_percent=1.0, user="tester",
                      state="sleeping", create_time=ps.create_time(), cmdline="python job")
    app = GputopApp(snapshots=with_process(scenario_snapshots("tour", 5), proc),
                    capture_timeout=10.0)  # long enough to see the progress line
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.table.row_count > 0)
        app.table.move_cursor(row=app.table.get_row_index(str(idle_job.pid)))
        await pilot.press("p")
        await until(pilot, lambda: app.capture_line.display)
        await pilot.pause()
        assert f"capture of pid {idle_job.pid}:" in screen_text(app)
        await until(pilot, lambda: any("no optimizer step" in n.message
                                       for n in app._notifications))
        note = next(n for n in app._notifications if "no optimizer step" in n.message)
        assert "\n" not in note.message and note.severity == "error"
        assert "no torch operator ran in the" in note.message
        assert not app.capture_line.display and not app.captures
        assert not isinstance(app.screen, DiagnosisScreen)


def test_request_capture_errors_are_one_line_agent_errors(idle_job):
    # No step: with --seconds' window support the agent records a window instead, and says so.
    reply = request_capture(idle_job.pid, timeout=1.0)
    assert reply["mode"] == "seconds" and "no optimizer step" in reply["notes"][0]
    # Abandoning a request frees the agent for the next one.
    started = time.monotonic()
    with pytest.raises(AgentError) as stopped:
        request_capture(idle_job.pid, timeout=30.0,
                        should_stop=lambda: time.monotonic() - started > 0.5)
    assert stopped.value.code == "cancelled"
    wait_for(lambda: (agent_status(idle_job.pid, timeout=ANSWER_S) or {}).get("capture", {})
             .get("state") == "idle", timeout=SLOW)
    # A process without an agent.
    with pytest.raises(AgentError) as none:
        request_capture(os.getpid())
    assert none.value.code == "no-agent" and "gputop run" in str(none.value)
