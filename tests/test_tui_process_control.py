"""nvitop's process control in the monitor, under Textual's pilot, on real processes: the
signal dialog's choice (TERM, INT, KILL; Cancel first), tagged processes signalled together,
`e` with the real environment and its secrets masked, --readonly refusing k and p; and the
findings and rows of a host whose other processes hold no GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace

import psutil
import pytest

from gputop.collect.environ import MASK, read_environment
from gputop.core.agent_status import parse_status
from gputop.core.model import ProcSample
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.ranking import rank_for_host
from gputop.tui.monitor.app import GputopApp
from gputop.tui.screens.confirm_signal import ConfirmSignalScreen
from gputop.tui.screens.env_screen import EnvironmentScreen
from gputop.tui.view.rows import build_rows
from tests.conftest import SLOW
from tests.tui_data import run_async, scenario_snapshots, screen_text, until, with_process

pytestmark = pytest.mark.timeout(2 * SLOW)

SNAPS = scenario_snapshots("memory-leak", 12)
SECRET = "s3cr3t-do-not-show"


def _proc(popen: subprocess.Popen, **kw) -> ProcSample:
    ps = psutil.Process(popen.pid)
    return ProcSample(pid=popen.pid, name="python", cpu_percent=1.0, rss=ps.memory_info().rss,
                      user="tester", state="sleeping", create_time=ps.create_time(),
                      cmdline=f"python -c sleep-{popen.pid}", uid=os.getuid(), **kw)


@pytest.fixture
def sleepers(spawn):
    """Two real processes that a signal can end; Python, so SIGINT is KeyboardInterrupt."""
    env = dict(os.environ, HF_TOKEN=SECRET, AWS_SECRET_ACCESS_KEY=SECRET, DB_PASSWORD=SECRET,
               WANDB_API_KEY=SECRET, PLAIN_SETTING="visible-value")
    return [spawn([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
            for _ in range(2)]


def on_gpu(sleepers) -> list:
    snaps = SNAPS
    for popen in sleepers:
        snaps = with_process(snaps, _proc(popen, gpu_mem=1 << 30, sm_util=20.0), gpu=0)
    return snaps


async def started(pilot):
    await until(pilot, lambda: pilot.app.frames_rendered > 0 and pilot.app.table.row_count)


def select(app, pid: int) -> None:
    app.table.move_cursor(row=app.table.get_row_index(str(pid)))


def ended(popen: subprocess.Popen) -> bool:
    return popen.poll() is not None


@pytest.mark.parametrize("key,signum", [("i", signal.SIGINT), ("9", signal.SIGKILL),
                                        ("t", signal.SIGTERM)])
@run_async
async def test_the_signal_dialog_sends_the_chosen_signal(sleepers, key, signum):
    target, other = sleepers
    app = GputopApp(snapshots=on_gpu(sleepers))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, target.pid)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSignalScreen))
        assert app.screen.focused.id == "cancel"  # Enter once too often sends nothing
        text = screen_text(app)
        assert all(f"{name} (" in text for name in ("TERM", "INT", "KILL", "Cancel"))
        await pilot.press(key)
        await until(pilot, lambda: ended(target))
    # SIGINT in Python: KeyboardInterrupt, whose exit then says SIGINT too.
    assert target.returncode == -signum
    assert not ended(other)


@run_async
async def test_enter_on_the_focused_cancel_sends_nothing(sleepers):
    target = sleepers[0]
    app = GputopApp(snapshots=on_gpu(sleepers))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, target.pid)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSignalScreen))
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmSignalScreen))
        await pilot.pause(0.3)
    assert not ended(target)


@run_async
async def test_space_tags_and_k_signals_every_tagged_process(sleepers):
    first, second = sleepers
    app = GputopApp(snapshots=on_gpu(sleepers))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        for popen in sleepers:
            select(app, popen.pid)
            await pilot.press("space")
        assert {r.pid for r in app.table.tagged_rows()} == {first.pid, second.pid}
        assert not app.paused  # space tags in the live monitor (P pauses)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSignalScreen))
        assert "2 tagged processes" in screen_text(app)
        await pilot.press("t")
        await until(pilot, lambda: ended(first) and ended(second))
    assert first.returncode == second.returncode == -signal.SIGTERM


@run_async
async def test_e_shows_the_environment_with_secrets_masked(sleepers):
    target = sleepers[0]
    app = GputopApp(snapshots=on_gpu(sleepers))
    async with app.run_test(size=(160, 60)) as pilot:
        await started(pilot)
        select(app, target.pid)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, EnvironmentScreen)
                    and app.screen.environment is not None)
        text = screen_text(app)
        assert "import time; time.sleep(600)" in text  # the full command line
        assert "PLAIN_SETTING=visible-value" in text
        env = app.screen.environment
        shown = dict(env.variables)
        for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "WANDB_API_KEY"):
            assert shown[name] == MASK
        assert SECRET not in text and env.masked >= 4
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, EnvironmentScreen))


def test_the_environment_of_an_ended_process_is_one_line(sleepers):
    popen = sleepers[0]
    popen.kill()
    popen.wait()
    env = read_environment(popen.pid)
    assert env.error == f"pid {popen.pid} has ended" and not env.variables


@run_async
async def test_readonly_refuses_k_and_p(sleepers):
    target = sleepers[0]
    app = GputopApp(snapshots=on_gpu(sleepers), readonly=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, target.pid)
        for key in ("k", "p"):
            await pilot.press(key)
            await until(pilot, lambda key=key: any(
                "--readonly" in n.message and f"({key})" in n.message
                for n in app._notifications))
        assert not isinstance(app.screen, ConfirmSignalScreen)
        assert not app.capture.traces
    assert not ended(target)


# -- this host's GPUs first --------------------------------------------------------------------


def _foreign_cpu_job(popen: subprocess.Popen) -> ProcSample:
    return replace(_proc(popen), uid=65534, user="nobody",
                   agent=parse_status({"pid": popen.pid, "steps_per_s": 5.0}))


def test_a_foreign_cpu_job_has_no_row_until_a_asks(sleepers):
    mine, foreign = sleepers
    snap = with_process(SNAPS[-1:], _proc(mine, gpu_mem=1 << 30), gpu=0)[0]
    snap = replace(snap, other_processes=(_foreign_cpu_job(foreign),))
    pids = {r.pid for r in build_rows(snap)}
    assert mine.pid in pids and foreign.pid not in pids
    assert foreign.pid in {r.pid for r in build_rows(snap, everyone=True)}


def test_findings_on_the_gpus_outrank_costlier_ones_on_no_gpu(sleepers):
    mine, foreign = sleepers
    snap = with_process(SNAPS[-1:], _proc(mine, gpu_mem=1 << 30), gpu=0)[0]
    snap = replace(snap, other_processes=(_foreign_cpu_job(foreign),
                                          replace(_proc(mine), pid=mine.pid + 4_000_000)))

    def f(id_, cost, **about):
        return Finding(id_, "critical", id_, "e", "f", "n", cost_s=cost, **about)

    findings = [f("host-bound", 9.0, pid=foreign.pid),  # costly, but on no GPU here
                f("gpu-idle", 8.0, pid=mine.pid + 4_000_000),  # mine, on no GPU
                f("memory-growth", 1.0, gpu=0),
                f("dataloader-stall", 2.0, gpu=0, pid=mine.pid)]
    ranked = [x.id for x in rank_for_host(findings, snap)]
    assert ranked == ["dataloader-stall", "memory-growth", "gpu-idle", "host-bound"]


@run_async
async def test_the_top_finding_is_selected_until_one_is_picked():
    app = GputopApp(snapshots=scenario_snapshots("tour", 90), diagnose=True)
    async with app.run_test(size=(200, 60)) as pilot:
        await until(pilot, lambda: len(app.findings.findings) >= 2)
        assert app.findings.selected == 0 and not app.findings.picked
        app.findings.focus()
        await pilot.press("down")
        assert app.findings.selected == 1 and app.findings.picked
