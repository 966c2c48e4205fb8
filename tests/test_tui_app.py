"""The live monitor under Textual's pilot: every key, on fixed snapshots (no sampler thread)
and once on the real sampler thread over a demo scenario."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys

import psutil
import pytest
from textual.strip import Strip

from gputop.core.model import ProcSample, WorkerSample
from gputop.tui.monitor.app import FrameReady, GputopApp
from gputop.tui.screens.confirm_signal import ConfirmSignalScreen
from gputop.tui.screens.help_screen import HelpScreen
from gputop.tui.screens.process_view import ProcessScreen
from gputop.tui.view.frames import build_frame
from tests.conftest import SLOW, wait_for
from tests.tui_data import (
    run_async,
    scenario_snapshots,
    screen_text,
    show_next,
    until,
    with_process,
)

pytestmark = pytest.mark.timeout(2 * SLOW)



TOUR = scenario_snapshots("tour", 90)




async def started(pilot):
    await until(pilot, lambda: pilot.app.frames_rendered > 0 and pilot.app.table.row_count)


def selected_pid(app) -> int:
    return app.table.selected_row().pid


def select(app, pid: int) -> None:
    app.table.move_cursor(row=app.table.get_row_index(str(pid)))


@pytest.fixture
def sleeper(spawn):
    """A real process the test owns, standing in for a training job."""
    return spawn([sys.executable, "-c", "import time; time.sleep(600)"])


def snapshots_with(sleeper) -> list:
    ps = psutil.Process(sleeper.pid)
    proc = ProcSample(pid=sleeper.pid, name="python", gpu_mem=2 * 1024**3, sm_util=50.0,
                      cpu_percent=10.0, rss=ps.memory_info().rss, user="tester",
                      state="sleeping", create_time=ps.create_time(),
                      cmdline="python -c sleep-test",
                      workers=(WorkerSample(pid=sleeper.pid + 100000, name="pt_data_worker",
                                            cpu_percent=5.0, rss=1, state="sleeping"),))
    return with_process(TOUR[-5:], proc, gpu=0)


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


@run_async
async def test_first_frame_shows_gpus_host_and_worker_rows():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        text = screen_text(app)
        assert "NVIDIA A100-SXM4-80GB" in text and "NVIDIA H100 80GB HBM3" in text
        assert "└─ pt_data_worker" in text
        assert "node-07" in text and "10:01:29" in text  # the snapshot's time, not the clock
        assert "no findings" in text  # the findings panel fits at 120x40
        assert "LOST" in text  # GPU 7 fell off the bus at 20 s


@run_async
async def test_rows_are_updated_in_place_and_selection_survives():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("down", "down", "down")
        before = selected_pid(app)
        row_keys = list(app.table.rows)
        for snap in TOUR[-10:]:  # new frames: same processes, other numbers
            app.feed.history.record(snap)
            app.feed.request_frame()
        rendered = app.frames_rendered
        await until(pilot, lambda: app.frames_rendered > rendered)
        assert selected_pid(app) == before
        assert list(app.table.rows) == row_keys  # the same Row objects: nothing rebuilt


@run_async
async def test_stale_frames_are_dropped_not_queued():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        rendered = app.frames_rendered
        for _ in range(40):  # a burst, faster than the UI handles them
            app.feed.request_frame()
        await until(pilot, lambda: app.frame.seq == app.feed.latest_seq)
        assert app.frames_rendered - rendered < 40
        # A frame that arrives after a newer one was posted is not drawn.
        old = build_frame(app.feed.history, TOUR[0], 60.0, seq=1)
        app.post_message(FrameReady(old))
        await pilot.pause()
        assert app.frame.seq == app.feed.latest_seq and app.frames_dropped >= 1


@run_async
async def test_a_long_run_keeps_no_regions_from_past_frames():
    """Each frame repaints the cells that changed. Textual keeps every region passed to a
    widget's refresh() until its own render_line renders it; the GPU panel and the process
    table render their lines themselves, so that set grew by each frame's changed spans
    for as long as the monitor ran (~14 regions a second on the tour: a leak). And the
    lines the screen stops showing are freed at once."""
    app = GputopApp(snapshots=TOUR[:30])
    async with app.run_test(size=(160, 50)) as pilot:
        await started(pilot)
        for snap in TOUR[30:]:
            await show_next(pilot, snap)
        for widget in (app.gpu_panel, app.table):
            kept = len(widget._dirty_regions)
            assert widget.virtual_size.height and kept <= widget.virtual_size.height, (widget, kept)
        # The lines the screen dropped were freed then, not left as cycles for the collector
        # (gputop.tui.textual_fixes.strip_cycles).
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            strips = sum(isinstance(o, Strip) for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert strips == 0


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
@run_async
async def test_quit_keys_exit_without_signalling(key, sleeper):
    app = GputopApp(snapshots=snapshots_with(sleeper))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, sleeper.pid)
        await pilot.pause()
        assert selected_pid(app) == sleeper.pid
        await pilot.press(key)
        await until(pilot, lambda: not app.is_running)
    assert app.return_code == 0
    assert alive(sleeper) and psutil.Process(sleeper.pid).status() != psutil.STATUS_ZOMBIE


@run_async
async def test_shift_p_pauses_and_resumes():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("P")
        assert app.paused and app.feed.paused
        await until(pilot, lambda: "PAUSED" in screen_text(app))
        await pilot.press("P")
        await until(pilot, lambda: "LIVE" in screen_text(app) and not app.paused)


@pytest.mark.parametrize("key,window,label", [
    ("2", 600.0, "10 min"), ("3", 3600.0, "1 h"), ("4", None, "whole run"), ("1", 60.0, "1 min"),
])
@run_async
async def test_number_keys_pick_the_chart_window(key, window, label):
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(160, 50)) as pilot:
        await started(pilot)
        seq = app.frame.seq
        await pilot.press(key)
        await until(pilot, lambda: app.frame.seq > seq)
        assert app.frame.window == window
        assert f"window {label}" in screen_text(app)
        span = app.frame.end - app.frame.start
        assert span == pytest.approx(window if window else 89.0)


@run_async
async def test_c_toggles_compact_mode_and_small_terminals_start_compact():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(160, 50)) as pilot:
        await started(pilot)
        assert not app.plan.compact  # 8 cards fit at 160x50
        await pilot.press("c")
        assert app.plan.compact
        await until(pilot, lambda: "⣿" not in screen_text(app))  # no braille charts left
        await pilot.press("c")
        assert not app.plan.compact
    small = GputopApp(snapshots=TOUR)
    async with small.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        assert small.plan.compact


@run_async
async def test_s_cycles_the_sort_and_shift_s_reverses():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        assert app.table.sort_key == "gpu"
        await pilot.press("s", "s", "s")  # in the columns' order: PID, USER, GPU MEM
        assert app.table.sort_key == "gpu_mem"
        mains = [r for r in app.table.rows_by_key.values() if r.parent is None]
        ordered = [app.table.get_row_index(r.key) for r in mains]
        mems = [r.cells["gpu_mem"] for r in sorted(mains, key=lambda r: ordered[mains.index(r)])]
        assert mems[0] == max(mems, key=lambda m: float(m[:-1]))  # biggest first
        first = app.table.get_row_at(0)[2].plain.strip()
        await pilot.press("S")
        assert app.table.reverse
        assert app.table.get_row_at(0)[2].plain.strip() != first
        assert "GPU MEM▲" in screen_text(app)


@run_async
async def test_slash_filters_and_escape_clears():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        total = app.table.row_count
        await pilot.press("slash")
        await pilot.press(*"host-sync")
        await until(pilot, lambda: app.table.row_count == 1)
        assert app.table.get_row_at(0)[2].plain.strip() == "4200"
        await pilot.press("enter")  # keeps the filter, back to the table
        assert app.table.has_focus and app.table.row_count == 1
        await until(pilot, lambda: "filter kept" in screen_text(app))  # says so on screen
        await pilot.press("slash")  # editing it again: no longer "kept"
        await until(pilot, lambda: "filter kept" not in screen_text(app))
        await pilot.press("escape")
        await until(pilot, lambda: app.table.row_count == total)


@run_async
async def test_t_toggles_worker_tree_and_flat_list():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        assert "└─ pt_data_worker" in screen_text(app)
        await pilot.press("t")
        assert not app.table.tree_view
        await until(pilot, lambda: "└─" not in screen_text(app))
        await pilot.press("t")
        await until(pilot, lambda: "└─ pt_data_worker" in screen_text(app))


@run_async
async def test_enter_opens_the_process_view_with_charts_from_history():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("down")  # a worker row: the view is of its training process
        assert app.table.selected_row().parent == 4100
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ProcessScreen))
        await until(pilot, lambda: app.frame.process is not None)
        assert app.frame.process.pid == 4100 and len(app.frame.process.cpu[0]) == 61  # both ends of 60 s
        text = screen_text(app)
        assert "pid 4100" in text and "DataLoader workers CPU" in text
        assert "GPU memory" in text and "⣿" in text  # a drawn chart
        # Its own SM share, each chart's maximum in the window, and a time axis under each.
        assert "GPU SM (this process)" in text and len(app.frame.process.gpu_sm[0]) == 61
        assert text.count(", max ") == 4, text
        assert text.count("-60s") == 4 and text.count("-30s") == 4 and text.count("now") >= 4
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ProcessScreen))
        assert app.feed.focus_pid is None


@run_async
async def test_the_process_view_shows_the_whole_command_folded_at_80_columns():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ProcessScreen))
        pid = app.screen.pid
        command = next(p.cmdline for g in app.frame.snapshot.gpus for p in g.processes
                       if p.pid == pid)
        lines = screen_text(app).splitlines()
        start = next(i for i, line in enumerate(lines) if f"pid {pid}" in line)
        title = "".join(line.strip() for line in lines[start:start + 4])
        assert command.replace(" ", "") not in lines[start].replace(" ", "")  # no one line
        assert command.replace(" ", "") in title.replace(" ", ""), (command, title)


@run_async
async def test_question_mark_shows_help():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = screen_text(app)
        assert "never signals" in text and "chart window" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))


@run_async
async def test_k_asks_naming_the_process_and_cancel_leaves_it(sleeper):
    app = GputopApp(snapshots=snapshots_with(sleeper))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, sleeper.pid)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSignalScreen))
        text = screen_text(app)
        assert f"Send a signal to process {sleeper.pid}?" in text
        assert all(name in text for name in ("TERM (t)", "INT (i)", "KILL (9)"))
        assert "python -c sleep-test" in text
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmSignalScreen))
        await pilot.pause(0.2)
    assert alive(sleeper)


@run_async
async def test_k_then_yes_sends_sigterm(sleeper):
    app = GputopApp(snapshots=snapshots_with(sleeper))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, sleeper.pid)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSignalScreen))
        await pilot.press("y")
        await until(pilot, lambda: not alive(sleeper))
    assert sleeper.returncode == -15


@run_async
async def test_p_without_an_agent_nor_py_spy_says_how_to_add_one(sleeper, monkeypatch):
    """Where py-spy cannot be used (here: GPUTOP_PY_SPY names none), `p` on a process
    without the agent keeps the hint (tests/test_stacks_tui.py: the stacks view otherwise)."""
    monkeypatch.setenv("GPUTOP_PY_SPY", "")
    app = GputopApp(snapshots=snapshots_with(sleeper))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        select(app, sleeper.pid)
        await pilot.press("p")
        await until(pilot, lambda: any("has no gputop agent" in n.message
                                       for n in app._notifications))
        note = next(n for n in app._notifications if "agent" in n.message).message
        assert str(sleeper.pid) in note and "gputop run -- python train.py" in note
        assert "py-spy is not installed" in note
        assert "\n" not in note


@run_async
async def test_p_with_an_agent_calls_the_capture_seam(tmp_path, monkeypatch, spawn):
    from gputop.client import agents as client
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    tmp_path.chmod(0o700)
    job = spawn(
        [sys.executable, "-c", "import gputop.agent, time; gputop.agent.install(); "
         "print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    assert job.stdout.readline().strip() == "ready"
    ps = psutil.Process(job.pid)
    proc = ProcSample(pid=job.pid, name="python", cpu_percent=1.0, user="tester",
                      state="sleeping", create_time=ps.create_time(), cmdline="python job")
    app = GputopApp(snapshots=with_process(TOUR[-3:], proc))
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await until(pilot, lambda: job.pid in client.list_agents())
        select(app, job.pid)
        await pilot.pause()
        assert selected_pid(app) == job.pid
        await pilot.press("p")
        await until(pilot, lambda: any(f"capture requested for pid {job.pid}" in n.message
                                       for n in app._notifications))


@run_async
async def test_findings_panel_renders_and_marks_the_gpu():
    from gputop.diagnostics.findings import Finding

    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(160, 50)) as pilot:
        await started(pilot)
        finding = Finding("dataloader-stall", "warning", "GPU 0 waits on the input pipeline",
                          "util 3% while 2 workers burn 99% CPU", "raise num_workers",
                          "nsys profile ...", gpu=0, pid=4100)
        app.show_findings([finding])
        await pilot.pause()
        text = screen_text(app)
        assert "dataloader-stall" in text and "fix: raise num_workers" in text
        assert app.gpu_panel.mark_of(0) == "warning" and "┏━  0 · " in screen_text(app)
        assert app.gpu_panel.mark_of(1) is None
        app.show_findings([])
        await pilot.pause()
        assert "no findings" in screen_text(app)


@run_async
async def test_resize_changes_the_layout_only_then():
    app = GputopApp(snapshots=TOUR)
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        assert app.plan.compact and not app.findings.display
        await pilot.resize_terminal(200, 60)
        await until(pilot, lambda: not app.plan.compact)
        assert app.findings.display
        text = screen_text(app)
        assert "╭─  0 · NVIDIA A100-SXM4-80GB" in text


@pytest.mark.timeout(4 * SLOW)
@run_async
async def test_live_sampler_thread_on_a_demo_scenario():
    """The real path: the thread worker opens the demo, samples, records and posts frames;
    quitting stops the stand-in processes."""
    app = GputopApp(demo="input-starved", interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frames_rendered >= 3)
        text = screen_text(app)
        assert "NVIDIA A100-SXM4-80GB" in text and "demo: input-starved" in text
        # The monitor does not wait for the demo's workers: they show as they are forked.
        tree = r"[├└]─ \S+ \(worker\)"  # the DataLoader workers, as a tree
        await until(pilot, lambda: len(re.findall(tree, screen_text(app))) == 2)
        # The demo's stand-ins: GPU processes and their workers (agent processes of other
        # jobs on this machine may be listed too; they are not ours to check).
        pids = [pid for g in app.frame.snapshot.gpus for p in g.processes
                for pid in (p.pid, *(w.pid for w in p.workers))]
        assert len(pids) == 3 and all(str(pid) in app.table.rows_by_key for pid in pids)
        assert app.feed.history.samples >= 3
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running)

    def left() -> dict[int, dict]:
        found = {}
        for pid in pids:
            try:
                info = psutil.Process(pid).as_dict(["status", "cmdline", "ppid"])
            except psutil.NoSuchProcess:
                continue
            if info["status"] != psutil.STATUS_ZOMBIE:
                found[pid] = info
        return found

    try:
        wait_for(lambda: not left(), timeout=SLOW)
    except AssertionError:
        assert not left()  # shows what is left
        raise


@run_async
async def test_table_numbers_settle_at_two_seconds_but_new_rows_show_at_once():
    from dataclasses import replace

    base = TOUR[-1]

    def with_cpu(snap, t, cpu, extra=()):
        gpus = tuple(
            replace(g, processes=tuple(replace(p, cpu_percent=cpu) for p in g.processes)
                    + (tuple(extra) if g.index == 0 else ()))
            for g in snap.gpus
        )
        return replace(snap, time=t, gpus=gpus)

    app = GputopApp(snapshots=[with_cpu(base, base.time, 11.0)])
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)

        async def show(snap):
            app.feed.history.record(snap)
            seq = app.feed.latest_seq
            app.feed.request_frame()
            await until(pilot, lambda: app.frame.seq > seq)

        def cpu_of(pid):
            return app.table.get_cell(str(pid), "cpu").plain

        await show(with_cpu(base, base.time + 1, 22.0))
        assert cpu_of(4100) == "11%"  # one second later: numbers alone wait
        newcomer = ProcSample(pid=999_999, name="python", cpu_percent=5.0, cmdline="new job")
        await show(with_cpu(base, base.time + 1.5, 33.0, [newcomer]))
        assert "999999" in app.table.rows_by_key and cpu_of(4100) == "33%"  # a new row: now
        await show(with_cpu(base, base.time + 2.5, 44.0, [newcomer]))
        assert cpu_of(4100) == "33%"
        await show(with_cpu(base, base.time + 3.6, 55.0, [newcomer]))
        assert cpu_of(4100) == "55%"
