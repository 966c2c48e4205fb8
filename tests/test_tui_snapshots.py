"""Screenshots of the monitor on fixed data, compared with the accepted SVGs in
tests/__snapshots__/ (pytest-textual-snapshot). Update after a deliberate change with
`pytest tests/test_tui_snapshots.py --snapshot-update` and look at the new SVGs."""

from __future__ import annotations

import time

import pytest

from gputop.tui.monitor.app import GputopApp
from tests.conftest import SLOW
from tests.tui_data import scenario_snapshots

pytestmark = pytest.mark.timeout(2 * SLOW)


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """The header shows local time: pin the zone so the screenshots match anywhere."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def first_frame(pilot) -> None:
    deadline = time.monotonic() + SLOW
    while not (pilot.app.frames_rendered and pilot.app.table.row_count):
        assert time.monotonic() < deadline, f"no frame within {SLOW} s"
        await pilot.pause(0.01)
    await pilot.pause()


def app_for(scenario: str) -> GputopApp:
    return GputopApp(snapshots=scenario_snapshots(scenario, 90))


def test_tour_80x24(snap_compare):
    assert snap_compare(app_for("tour"), terminal_size=(80, 24), run_before=first_frame)


def test_tour_160x50(snap_compare):
    assert snap_compare(app_for("tour"), terminal_size=(160, 50), run_before=first_frame)


def test_input_starved_120x40_process_view(snap_compare):
    async def open_view(pilot) -> None:
        await first_frame(pilot)
        await pilot.press("enter")
        for _ in range(200):
            if pilot.app.frame.process is not None:
                break
            await pilot.pause(0.01)
        await pilot.pause()

    assert snap_compare(app_for("input-starved"), terminal_size=(120, 40), run_before=open_view)


def test_help_80x24(snap_compare):
    async def help_screen(pilot) -> None:
        await first_frame(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app_for("healthy"), terminal_size=(80, 24), run_before=help_screen)


def test_input_starved_findings_120x40(snap_compare):
    """The live rules over the replayed snapshots: the findings panel, the marked card, and
    the glyph before the training process's command."""
    app = GputopApp(snapshots=scenario_snapshots("input-starved", 90), diagnose=True)
    assert snap_compare(app, terminal_size=(120, 40), run_before=first_frame)


def test_diagnosis_screen_120x40(snap_compare):
    from gputop.diagnostics.trace.analysis import analyze_trace
    from tests.conftest import DEMO_TRACE

    # A real capture of the demo's trainer, shipped with the tests (runs without ../shared).
    analysis = analyze_trace(DEMO_TRACE)
    # The path as a capture would name it (the real file's location differs per machine).
    trace = "/home/alice/.local/state/gputop/captures/node-07_4100.1767261690000.pt.trace.json.gz"

    async def diagnosis(pilot) -> None:
        await first_frame(pilot)
        pilot.app.show_diagnosis(4100, analysis, trace)
        await pilot.pause()
        await pilot.pause()

    app = app_for("input-starved")
    assert snap_compare(app, terminal_size=(120, 40), run_before=diagnosis)
