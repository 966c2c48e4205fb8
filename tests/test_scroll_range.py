"""A scroll view's new virtual size lays the screen out again only when something on it moves:
the scrollbar shows or hides, or the width changes (gputop/tui/widgets/scroll_range.py)."""

from __future__ import annotations

from contextlib import asynccontextmanager

from textual.app import App, ComposeResult
from textual.geometry import Size
from textual.scroll_view import ScrollView

from gputop.tui.widgets.scroll_range import set_virtual_size
from tests.tui_data import run_async


class Lines(ScrollView):
    DEFAULT_CSS = "Lines { height: 6; overflow-x: hidden; scrollbar-size-vertical: 1; }"


class LinesApp(App):
    def compose(self) -> ComposeResult:
        yield Lines()


@asynccontextmanager
async def lines_of(height: int):
    """A running app whose 6-line view scrolls over ``height`` lines: (pilot, view)."""
    app = LinesApp()
    async with app.run_test(size=(40, 12)) as pilot:
        view = app.query_one(Lines)
        view.virtual_size = Size(39, height)
        await pilot.pause()
        yield pilot, view


@run_async
async def test_a_longer_scroll_range_with_the_scrollbar_shown_needs_no_layout():
    async with lines_of(10) as (pilot, view):
        assert view.show_vertical_scrollbar
        layouts = []
        screen = pilot.app.screen
        refresh_layout = screen._refresh_layout

        def counted(*args, **kwargs):
            layouts.append(1)
            return refresh_layout(*args, **kwargs)

        screen._refresh_layout = counted  # observed, not replaced: it still lays out
        set_virtual_size(view, Size(39, 30))
        await pilot.pause()
        assert layouts == []
        assert view.virtual_size == Size(39, 30)
        assert view.max_scroll_y == 30 - 6
        assert view.vertical_scrollbar.window_virtual_size == 30
        view.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert view.scroll_offset.y == 24

        # Shorter than the view: the scrollbar goes, the content widens: a layout.
        view.scroll_home(animate=False, immediate=True)
        await pilot.pause()
        set_virtual_size(view, Size(39, 3))
        await pilot.pause()
        assert layouts
        assert not view.show_vertical_scrollbar
        assert view.virtual_size == Size(39, 3)


@run_async
async def test_a_scroll_position_past_the_new_end_takes_the_layout():
    async with lines_of(40) as (pilot, view):
        view.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert view.scroll_offset.y == 34
        set_virtual_size(view, Size(39, 20))
        await pilot.pause()
        assert view.virtual_size == Size(39, 20)
        assert view.scroll_offset.y <= 20 - 6
