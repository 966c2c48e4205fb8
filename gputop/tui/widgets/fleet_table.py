"""The fleet's rows (one per node and GPU) drawn through the line API, with a row cursor.

A DataTable with a few hundred rows redrawn every second costs far more than the rows
themselves: here a row is a ready Text, turned into a strip only when it is painted, so rows
scrolled out of view cost nothing. The cursor stays on the same (node, GPU) across updates.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputop.tui.view.fleet_rows import FleetRow

_CURSOR = Style(reverse=True)


class FleetTable(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    FleetTable { height: 1fr; scrollbar-size-vertical: 1; overflow-x: hidden; }
    """
    BINDINGS = [
        Binding("up,k", "move(-1)", show=False),
        Binding("down,j", "move(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "to(0)", show=False),
        Binding("end", "to(-1)", show=False),
        Binding("enter", "choose", "Node", show=True),
    ]

    VIRTUAL_STEP = 8

    class Chosen(Message):
        """Enter on a row: open that node's screen."""

        def __init__(self, row: FleetRow) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[FleetRow] = []
        self.cursor = 0
        self._strips: dict[int, Strip] = {}

    def update_rows(self, rows: Sequence[FleetRow]) -> None:
        """Show ``rows``; repaint only the lines whose text changed."""
        key = self.rows[self.cursor].key if self.rows and self.cursor < len(self.rows) else None
        old = self.rows
        self.rows = list(rows)
        if key is not None:
            # The cursor follows its row; a node that collapsed to one row keeps it too.
            keys = [r.key for r in self.rows]
            if key in keys:
                self.cursor = keys.index(key)
            else:
                hosts = [r.host for r in self.rows]
                self.cursor = hosts.index(key[0]) if key[0] in hosts else 0
        self.cursor = min(self.cursor, max(0, len(self.rows) - 1))
        self._size_to_rows()
        changed = [i for i in range(max(len(old), len(self.rows)))
                   if i >= len(old) or i >= len(self.rows) or old[i].text != self.rows[i].text]
        for i in changed:
            self._strips.pop(i, None)
        if changed or key is None:
            self._refresh_lines(changed)

    def _refresh_lines(self, lines: list[int]) -> None:
        top = self.scroll_offset.y
        height = self.scrollable_content_region.height
        visible = [i - top for i in lines if top <= i < top + height]
        if len(visible) > 8 or not lines:
            self.refresh()
            return
        width = self.size.width
        for y in visible:
            self.refresh(Region(0, y, width, 1))

    def _size_to_rows(self) -> None:
        """A new virtual size re-lays out the whole screen: while the rows fit it is the
        widget's own height, past that it moves in steps of VIRTUAL_STEP lines."""
        region = self.scrollable_content_region
        height = len(self.rows)
        if height <= region.height:
            height = region.height
        else:
            height = -(-height // self.VIRTUAL_STEP) * self.VIRTUAL_STEP
        if self.virtual_size != (region.width, height):
            self.virtual_size = Size(region.width, height)

    def on_resize(self) -> None:
        self._strips.clear()
        self._size_to_rows()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def selected(self) -> FleetRow | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    def render_line(self, y: int) -> Strip:
        index = self.scroll_offset.y + y
        width = self.scrollable_content_region.width
        base = self.rich_style
        if index >= len(self.rows):
            return Strip.blank(width, base)
        strip = self._strips.get(index)
        if strip is None:
            segments = list(self.rows[index].text.render(self.app.console))
            strip = Strip(segments).apply_style(base).crop_extend(0, width, base)
            self._strips[index] = strip
        if index == self.cursor and self.has_focus:
            strip = strip.apply_style(_CURSOR)
        return strip

    def _move_to(self, index: int) -> None:
        if not self.rows:
            return
        old = self.cursor
        self.cursor = max(0, min(len(self.rows) - 1, index))
        if self.cursor != old:
            self._refresh_lines([old, self.cursor])
        self.scroll_to_region(Region(0, self.cursor, 1, 1), animate=False)

    def action_move(self, delta: int) -> None:
        self._move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self.cursor + direction * max(1, self.scrollable_content_region.height - 1))

    def action_to(self, index: int) -> None:
        self._move_to(len(self.rows) - 1 if index < 0 else index)

    def action_choose(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(self.Chosen(row))

    def on_focus(self) -> None:
        self._refresh_lines([self.cursor])

    def on_blur(self) -> None:
        self._refresh_lines([self.cursor])
