"""`p` on a process without the agent opens the stacks view (py-spy, sampled in a thread
worker), and a live `dataloader-stall` carries the function behind it: under Textual's pilot
on real processes, and in a real terminal (tmux) on a plain training job that stands on the
demo's simulated GPU 0 (GPUTOP_DEMO_PIDS)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from gputop.core.model import ProcSample
from gputop.diagnostics.findings import Finding
from gputop.tui.monitor.app import GputopApp
from gputop.tui.screens.stacks_screen import StacksScreen
from gputop.tui.widgets.findings import findings_text
from tests.conftest import SLOW, end_popen, wait_for
from tests.scripts.stacks_testkit import (
    BURNER,
    stacks_readable,  # noqa: F401 (the fixture)
)
from tests.test_stacks_cli import hot_lines, start_job
from tests.test_tui_app import run_async, select, started, until
from tests.test_tui_terminal import start, terminal  # noqa: F401 (the fixture)
from tests.tui_data import scenario_snapshots, screen_text, with_process

pytestmark = pytest.mark.timeout(4 * SLOW)

TOUR = scenario_snapshots("tour", 5)


@pytest.fixture
def burner(spawn):
    proc = spawn([sys.executable, "-c", BURNER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def snapshots_with(proc: subprocess.Popen) -> list:
    ps = psutil.Process(proc.pid)
    sample = ProcSample(pid=proc.pid, name="python", gpu_mem=1 << 30, cpu_percent=99.0,
                        user="tester", state="running", create_time=ps.create_time(),
                        cmdline="python -c burner")
    return with_process(TOUR, sample, gpu=0)


def py_spies() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "py-spy" and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            pass
    return found


@pytest.mark.usefixtures("stacks_readable")
@run_async
async def test_p_without_an_agent_shows_the_python_stacks(burner):
    app = GputopApp(snapshots=snapshots_with(burner))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, burner.pid)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen))
        screen = app.screen
        assert screen.pid == burner.pid
        # While py-spy samples, the event loop goes on: the progress line keeps counting.
        await until(pilot, lambda: screen.report is not None or screen.error is not None)
        assert screen.error is None, screen.error
        await until(pilot, lambda: "where:" in screen_text(app))  # laid out on screen
        text = screen_text(app)
        assert f"Python stacks of pid {burner.pid}" in text
        assert "where: parse_records (<string>:5)" in text, text
        assert "no gputop agent: py-spy samples" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, StacksScreen))


@pytest.mark.usefixtures("stacks_readable")
@run_async
async def test_leaving_the_stacks_view_while_it_samples_ends_py_spy(burner):
    app = GputopApp(snapshots=snapshots_with(burner))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, burner.pid)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen))
        await until(pilot, lambda: bool(py_spies()))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, StacksScreen))
        await until(pilot, lambda: not py_spies())  # killed, not left to finish


def test_the_findings_panel_shows_where():
    f = Finding(id="dataloader-stall", severity="critical", title="GPU 0 starved",
                evidence="busy 3%", fix="more workers", next_step="", gpu=0, pid=42,
                where="decode_sample (train.py:30), 98 % of main-process samples\x1b[2J")
    text = findings_text([f]).plain
    lines = text.splitlines()
    # The selected finding in full: its title, then where.
    assert lines[lines.index("GPU 0 starved") + 1] == (
        "where: decode_sample (train.py:30), 98 % of main-process samples\\x1b[2J")
    assert "where" not in findings_text([Finding(**{**f.__dict__, "where": None})]).plain


@pytest.mark.usefixtures("stacks_readable")
def test_in_a_terminal_p_shows_the_stacks_and_the_stall_names_its_function(terminal):  # noqa: F811
    """The acceptance run: a plain `python train.py` (num_workers=0, CPU burnt in
    decode_sample) on the demo's GPU 0; `gputop` on it in tmux."""
    job = start_job("--hot", "loader")
    try:
        term = terminal(160, 50, GPUTOP_DEMO_PIDS=f"0:{job.pid}")
        proc = start(term, "--demo input-starved")
        wait_for(lambda: str(job.pid) in term.capture(), timeout=SLOW)
        # Without the agent nothing tells loading in the loop from other Python: the live
        # rule raises host-bound, and the where line (py-spy, after it) names the loader.
        wait_for(lambda: "host-bound" in term.capture(), timeout=2 * SLOW, interval=0.2)
        wait_for(lambda: "where: decode_sample" in term.capture(), timeout=SLOW, interval=0.2)
        pressed = time.monotonic()
        term.keys("p")
        wait_for(lambda: f"Python stacks of pid {job.pid}" in term.capture(), timeout=SLOW,
                 interval=0.1)
        shown = time.monotonic() - pressed  # reported, not asserted: see bench_stacks.py
        wait_for(lambda: "where: decode_sample (plain_train.py:" in term.capture(),
                 timeout=SLOW, interval=0.1)
        screen = term.capture()
        line = next(x for x in screen.splitlines() if "where: decode_sample" in x)
        assert any(f"plain_train.py:{n})" in line for n in hot_lines("decode_sample")), line
        print(f"stacks view shown {shown:.1f} s after p")
        term.keys("Escape")
        wait_for(lambda: "findings" in term.capture(), timeout=SLOW)
        term.keys("q")
        proc.wait(timeout=SLOW)
        wait_for(lambda: "exit=0" in term.capture(), timeout=SLOW)
    finally:
        end_popen(job)
