"""The process-wide caches drawing fills (rich's cell widths, Textual's Region geometry) hold
at most a few frames' values (gputop.tui.textual_fixes.render_caches): each tick's figures are new strings,
and left alone the caches keep thousands of them for as long as the monitor runs."""

from __future__ import annotations

from rich.cells import cached_cell_len
from textual.geometry import Region

from gputop.tui.monitor.app import GputopApp
from gputop.tui.textual_fixes import render_caches
from tests.tui_data import run_async, scenario_snapshots, show_next, until

TOUR = scenario_snapshots("tour", 60)


def held() -> tuple[int, int]:
    return cached_cell_len.cache_info().currsize, Region.translate.cache_info().currsize


@run_async
async def test_the_caches_hold_a_few_frames_of_values():
    app = GputopApp(snapshots=TOUR[:20])
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.frames_rendered > 0 and app.table.row_count)
        sizes = []
        for snap in TOUR[20:]:
            await show_next(pilot, snap)
            sizes.append((app.frames_rendered, *held()))
    cleared = [(n, cells, regions) for n, cells, regions in sizes
               if n % render_caches.EVERY_FRAMES == 0]
    grown = [(n, cells, regions) for n, cells, regions in sizes
             if n % render_caches.EVERY_FRAMES == render_caches.EVERY_FRAMES - 1]
    assert len(cleared) >= 6 and grown
    # After a clear the caches hold one paint's values; before the next, the frames' since.
    assert max(c for _, c, _ in cleared) < min(c for _, c, _ in grown)
    assert max(r for _, _, r in cleared) < min(r for _, _, r in grown)
    # Never the thousands the caches allow: a few frames' worth.
    assert max(c for _, c, _ in sizes) < 1500, sizes
