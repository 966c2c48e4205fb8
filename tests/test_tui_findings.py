"""Findings in the live monitor on fixed snapshots: the panel, the GPU and process marks, the
diagnosis screen on a real trace, and the auto-capture throttle on a scripted clock."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest

from gputop.diagnostics.findings import Finding
from gputop.diagnostics.trace.analysis import analyze_trace
from gputop.tui.monitor.app import GputopApp
from gputop.tui.monitor.auto_capture import MIN_INTERVAL_S, AutoCapturePolicy
from gputop.tui.screens.diagnosis_screen import DiagnosisScreen
from gputop.tui.view.rows import build_rows
from gputop.tui.view.severity import SEVERITY_MARK
from gputop.tui.widgets.findings import findings_text
from tests.conftest import DEMO_TRACE, SLOW
from tests.tui_data import run_async, scenario_snapshots, screen_text, until

pytestmark = pytest.mark.timeout(2 * SLOW)

STARVED = scenario_snapshots("input-starved", 40)






def finding(id_: str = "dataloader-stall", pid: int | None = 4100, gpu: int | None = 0,
            severity: str = "warning") -> Finding:
    return Finding(id_, severity, f"{id_} on GPU {gpu}", "util 3% while workers burn 99%",
                   "raise num_workers", "gputop capture", gpu=gpu, pid=pid)


# -- pure parts ------------------------------------------------------------------------------

def test_process_rows_carry_the_worst_severity_glyph_before_the_command():
    snap = STARVED[-1]
    plain = {r.pid: r.cells["command"] for r in build_rows(snap)}
    marked = {r.pid: r.cells["command"] for r in build_rows(snap, marks={4100: "critical"})}
    assert marked[4100] == "‼ " + plain[4100]
    workers = [pid for pid in plain if pid != 4100]
    assert workers and all(marked[pid] == plain[pid] for pid in workers)


def test_findings_text_lists_all_and_shows_the_selected_one_in_full_with_its_note():
    a, b = finding(), finding("pcie-bound", pid=4200, gpu=1)
    note = "capture: dataloader-stall, trace /tmp/x.pt.trace.json.gz"
    notes = {("dataloader-stall", 0, 4100): note}
    first = findings_text([a, b], notes, selected=0).plain
    # The list names both, one line each; the detail is the selected one's, note included.
    assert first.index("dataloader-stall") < first.index("pcie-bound") < first.index(note)
    assert "evidence: util 3% while workers burn 99%" in first and "fix: raise num_workers" in first
    second = findings_text([a, b], notes, selected=1).plain
    assert note not in second  # a note belongs to its finding
    assert "pcie-bound on GPU 1" in second.split("─")[-1]
    assert findings_text([]).plain == "no findings"


def test_auto_capture_fires_once_per_raise_and_at_most_every_ten_minutes_per_pid():
    clock = [1000.0]
    policy = AutoCapturePolicy(clock=lambda: clock[0])
    stall = finding()
    assert policy.due([stall], with_agent={4100}) == [stall]
    # Still active on the next frames: no second capture.
    assert policy.due([stall], with_agent={4100}) == []
    # It clears and raises again 5 minutes later: too soon for the same process.
    clock[0] += 300
    assert policy.due([], with_agent={4100}) == []
    assert policy.due([stall], with_agent={4100}) == []
    # ... but another process is not held back by it.
    other = finding("host-sync", pid=4300, gpu=2)
    assert policy.due([stall, other], with_agent={4100, 4300}) == [other]
    # Ten minutes after the first capture a new raise captures again.
    clock[0] = 1000.0 + MIN_INTERVAL_S
    policy.due([], with_agent={4100})
    assert policy.due([stall], with_agent={4100}) == [stall]


def test_auto_capture_needs_a_stall_a_pid_and_an_agent():
    clock = [0.0]
    policy = AutoCapturePolicy(clock=lambda: clock[0])
    assert policy.due([finding("throttling")], with_agent={4100}) == []  # not a stall
    assert policy.due([finding(pid=None)], with_agent={4100}) == []  # no process to ask
    late = finding(pid=4200)
    assert policy.due([late], with_agent={4100}) == []  # no agent in it (yet)
    # Its agent comes up while the finding is still active: captured then, once.
    assert policy.due([late], with_agent={4100, 4200}) == [late]
    assert policy.due([late], with_agent={4100, 4200}) == []
    # A capture made with `p` counts as the process's capture.
    policy.record(4500)
    clock[0] += 60
    assert policy.due([finding(pid=4500)], with_agent={4500}) == []


# -- in the app ------------------------------------------------------------------------------

@run_async
async def test_replayed_snapshots_raise_the_stall_in_the_panel_card_and_row():
    app = GputopApp(snapshots=STARVED, diagnose=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.findings.findings and app.gpu_panel.lines)
        await pilot.pause()
        stall = app.findings.findings[0]
        assert (stall.id, stall.gpu, stall.pid) == ("dataloader-stall", 0, 4100)
        text = screen_text(app)
        assert "findings (1)" in text and "dataloader-stall" in text and "fix:" in text
        assert app.gpu_panel.mark_of(0) == stall.severity
        mark = SEVERITY_MARK[stall.severity]  # critical here: the GPU idles over a quarter
        assert app.table.get_cell("4100", "command").plain.strip().startswith(f"{mark} python")
        # The mark goes with the finding, at once (not at the pace of the numbers).
        app.show_findings([])
        await pilot.pause()
        assert app.gpu_panel.mark_of(0) is None
        assert app.table.get_cell("4100", "command").plain.strip().startswith("python")


@run_async
async def test_findings_panel_wraps_long_evidence_at_word_boundaries():
    long = replace(finding(), evidence="word " * 60)
    app = GputopApp(snapshots=STARVED)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frames_rendered > 0)
        app.show_findings([long])
        await pilot.pause()
        app.findings.select(0)  # its detail in view
        await until(pilot, lambda: "fix:" in screen_text(app))
        lines = [line for line in screen_text(app).splitlines() if "word word" in line]
        assert len(lines) >= 2  # 300 characters over a panel under the table, 118 wide
        words = [w for w in " ".join(lines).replace("evidence:", " ").split() if w.isalpha()]
        assert words == ["word"] * 60  # every word whole: no word cut across lines


@run_async
async def test_diagnosis_screen_shows_the_report_trace_and_how_to_open_it():
    analysis = analyze_trace(DEMO_TRACE)
    # Where a capture would save it (the checkout's own path could be too long for one line).
    trace = "/home/alice/captures/node-07_4100.1767261690000.pt.trace.json.gz"
    app = GputopApp(snapshots=STARVED)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frames_rendered > 0)
        app.show_diagnosis(4100, analysis, trace)
        await until(pilot, lambda: isinstance(app.screen, DiagnosisScreen))
        await pilot.pause()
        text = screen_text(app)
        assert "diagnosis of pid 4100: dataloader-stall" in text
        assert "Where the step time went" in text and "Fix:" in text
        assert f"trace: {trace}" in text
        assert "https://ui.perfetto.dev" in text
        assert "tensorboard --logdir /home/alice/captures" in text
        # The top operators and what was assessed are further down: the report scrolls.
        assert "Not assessed" not in text
        await pilot.press("end")
        await pilot.pause()
        assert "Top CPU ops (self time)" in screen_text(app)
        assert "Not assessed" in screen_text(app)
        await pilot.press("q")  # closes the screen; it does not quit the monitor
        await until(pilot, lambda: not isinstance(app.screen, DiagnosisScreen))
        assert app.is_running
        app.show_diagnosis(4100, analysis, trace)
        await until(pilot, lambda: isinstance(app.screen, DiagnosisScreen))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DiagnosisScreen))


@run_async
async def test_findings_panel_scrolls_when_they_do_not_fit():
    many = [finding("contention" if i == 59 else "host-sync", pid=5000 + i, gpu=i % 8)
            for i in range(60)]
    app = GputopApp(snapshots=STARVED)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frames_rendered > 0)
        app.show_findings(many)
        await pilot.pause()
        # The first one's detail is in view; the last one's (its head: severity, id) is not.
        detail_of_last = re.compile(r"(info|warning|critical) contention")
        assert not detail_of_last.search(screen_text(app))
        app.findings.select(59)  # the last one: the view follows the selection
        await until(pilot, lambda: detail_of_last.search(screen_text(app)))
        assert "findings (60)" in screen_text(app)


def test_the_list_keeps_its_order_while_the_same_findings_stay_active():
    """Costs move every tick; the lines must not swap under the cursor until one raises or
    clears."""
    from textual.app import App

    from gputop.tui.widgets.findings import FindingsView

    def finding(fid: str, gpu: int, cost: float) -> Finding:
        return Finding(id=fid, severity="warning", title=f"{fid} on GPU {gpu}", evidence="e",
                       fix="f", next_step="", gpu=gpu, cost_s=cost)

    class One(App):
        def compose(self):
            yield FindingsView()

    async def drive() -> None:
        app = One()
        async with app.run_test(size=(100, 20)) as pilot:
            view = app.query_one(FindingsView)
            view.update_findings([finding("host-sync", 1, 2.0), finding("throttling", 2, 1.0)])
            view.select(1)
            # The costs swap: the order and the selection stay.
            view.update_findings([finding("throttling", 2, 3.0), finding("host-sync", 1, 0.5)])
            assert [f.id for f in view.findings] == ["host-sync", "throttling"]
            assert view.findings[view.selected].id == "throttling"
            # A new finding while the reader walks the list: the others keep their places, it
            # goes after the last that ranks before it; the selection stays on its finding.
            view.update_findings([finding("throttling", 2, 3.0), finding("contention", 5, 2.0),
                                  finding("host-sync", 1, 0.5)])
            assert [f.id for f in view.findings] == ["host-sync", "throttling", "contention"]
            assert view.findings[view.selected].id == "throttling"
            # One that ranks first goes first.
            view.update_findings([finding("memory-growth", 0, 9.0), finding("throttling", 2, 3.0),
                                  finding("contention", 5, 2.0), finding("host-sync", 1, 0.5)])
            assert view.findings[0].id == "memory-growth"
            assert view.findings[view.selected].id == "throttling"
            await pilot.pause()
            assert "throttling on GPU 2" in view.text.plain

    asyncio.run(drive())
