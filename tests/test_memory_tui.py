"""`m` and `M` in the live monitor, all real: CPU training jobs with the agent, under Textual's
pilot and in a real terminal (tmux) where the job stands on the demo's leaking GPU 0
(GPUTOP_DEMO_PIDS): `m` shows the growth by line, and the memory-growth finding then names
that line; a job that dies of an allocation failure is announced, and `M` shows its report."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

import psutil
import pytest

from gputop.core.agent_status import parse_status
from gputop.core.model import ProcSample
from gputop.tui.monitor.app import GputopApp
from tests.conftest import REPO, SLOW, end_popen, wait_for
from tests.scripts.agent_testkit import gputop_run, private_agent_world, wait_for_steps
from tests.test_tui_terminal import Tmux, start, tmux_or_skip
from tests.tui_data import run_async, scenario_snapshots, screen_text, until, with_process

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(6 * SLOW)

JOBS = REPO / "tests" / "scripts" / "memory_jobs.py"
sys.path.insert(0, str(JOBS.parent))
from memory_jobs import APPEND_LINE  # noqa: E402


@pytest.fixture
def world(tmp_path):
    with private_agent_world(tmp_path / "captures", OMP_NUM_THREADS="1") as (env, _):
        yield env


def delayed_job(env: dict[str, str], delay: float, *args: str) -> subprocess.Popen:
    """A job under `gputop run` that starts after ``delay`` s in the same process (exec keeps
    the pid): the monitor can be told its pid before it runs."""
    command = " ".join(shlex.quote(x) for x in (sys.executable, "-m", "gputop", "run", "--",
                                               sys.executable, str(JOBS), *args))
    return subprocess.Popen(["sh", "-c", f"sleep {delay}; exec {command}"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@run_async
async def test_m_shows_where_the_memory_goes(world):
    job = gputop_run([sys.executable, str(JOBS), "grow", "--grow-mib", "1"], world)
    try:
        assert job.stdout.readline().strip() == "training"
        wait_for_steps(job.pid, 3)
        ps = psutil.Process(job.pid)
        proc = ProcSample(pid=job.pid, name="python", cpu_percent=10.0, user="tester",
                          state="running", create_time=ps.create_time(),
                          cmdline="python memory_jobs.py grow", agent=parse_status({"steps": 3}))
        app = GputopApp(snapshots=with_process(scenario_snapshots("tour", 5), proc))
        async with app.run_test(size=(140, 45)) as pilot:
            from gputop.tui.screens.memory_screen import MemoryScreen

            await until(pilot, lambda: app.table.row_count > 0)
            app.table.move_cursor(row=app.table.get_row_index(str(job.pid)))
            await pilot.press("m")
            await until(pilot, lambda: isinstance(app.screen, MemoryScreen))
            screen = app.screen
            await until(pilot, lambda: screen.report is not None or screen.error)
            assert screen.error is None
            await pilot.pause()
            text = screen_text(app)
            assert f"memory of pid {job.pid}" in text
            assert f"+1.00 MiB/step  memory_jobs.py:{APPEND_LINE} keep" in text
            assert "global `history` of memory_jobs.py" in text
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, MemoryScreen))
            await pilot.press("q")
    finally:
        end_popen(job)


@run_async
async def test_a_process_that_dies_of_an_allocation_failure_is_shown_with_M(world,
                                                                               monkeypatch):
    """The job sets an address-space limit and grows 16 MiB a step until the CPU allocator
    fails; the monitor watched it with its agent, so it looks for its report when it is
    gone, says so, and `M` shows what held the memory."""
    job = delayed_job(world, 6, "oom", "--grow-mib", "16", "--step-ms", "250")
    try:
        for key in ("XDG_RUNTIME_DIR", "GPUTOP_CAPTURE_DIR"):
            monkeypatch.setenv(key, world[key])
        monkeypatch.setenv("GPUTOP_DEMO_PIDS", f"0:{job.pid}")
        app = GputopApp(demo="memory-leak", interval=0.5)
        async with app.run_test(size=(140, 45)) as pilot:
            from gputop.tui.screens.memory_screen import MemoryScreen

            await until(pilot, lambda: job.pid in app.capture.agent_pids, timeout=2 * SLOW)
            await until(pilot, lambda: job.poll() is not None, timeout=2 * SLOW)
            await until(pilot, lambda: job.pid in app.capture.ooms)
            # The notice is a message of its own: the App shows it on its next turn.
            await until(pilot, lambda: any("ran out of memory" in n.message
                                           for n in app._notifications))
            note = next(n for n in app._notifications if "ran out of memory" in n.message)
            assert f"pid {job.pid} ran out of memory at memory_jobs.py:{APPEND_LINE}" \
                in note.message and note.severity == "error"
            await pilot.press("M")
            await until(pilot, lambda: isinstance(app.screen, MemoryScreen))
            await pilot.pause()
            text = screen_text(app)
            assert f"out-of-memory report of pid {job.pid}" in text
            assert "asked for 16.0 MiB" in text and "global `history` of memory_jobs.py" in text
            await pilot.press("escape")
            await pilot.press("q")
    finally:
        end_popen(job)


def test_in_a_terminal_m_shows_the_growth_by_line_and_the_finding_then_names_it(world):
    """Acceptance 5 (and 2): `gputop --demo memory-leak` in tmux with the grow job on its
    leaking GPU 0. memory-growth raises and suggests `gputop memory PID --steps 3`; `m` shows
    the growth by line (how soon is printed: the acceptance asks for 10 s); back on the main
    screen, the finding's where names the line."""
    tmux_or_skip()
    job = delayed_job(world, 5, "grow", "--grow-mib", "0.5", "--max-mib", "256")
    term = Tmux(180, 55, {**world, "GPUTOP_DEMO_PIDS": f"0:{job.pid}"})
    try:
        start(term, "--demo memory-leak")
        wait_for(lambda: "memory-growth" in term.capture(), timeout=3 * SLOW, interval=0.2)
        # Once the monitor sees the job's agent, the next step is its memory capture.
        wait_for(lambda: f"next: gputop memory {job.pid}" in term.capture(),
                 timeout=2 * SLOW, interval=0.2)
        pressed = time.monotonic()
        term.keys("m")
        wait_for(lambda: f"+512 KiB/step  memory_jobs.py:{APPEND_LINE} keep" in term.capture(),
                 timeout=SLOW, interval=0.1)
        shown = time.monotonic() - pressed
        print(f"growth by line shown {shown:.1f} s after m")
        assert "kept by: a list of" in term.capture()
        term.keys("Escape")
        wait_for(lambda: f"where: memory_jobs.py:{APPEND_LINE} keep" in term.capture(),
                 timeout=SLOW, interval=0.2)
        term.keys("q")
        wait_for(lambda: "exit=0" in term.capture(), timeout=SLOW)
    finally:
        running = term.processes()
        term.kill()
        from tests.conftest import end_processes

        end_processes(running)
        end_popen(job)
