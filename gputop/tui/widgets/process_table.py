"""The process table: GPU processes with their DataLoader workers, keyed by pid.

Drawn through the line API, one ready strip per row: a tick that changes two numbers repaints
the cells of those two rows and nothing else. (Textual's DataTable re-rendered every visible
cell through Rich after any update, which made it the costliest part of a frame.) Rows are
keyed by pid, so the selection and the scroll position survive every tick, sorting and
filtering; the header stays in place while the rows scroll.

The command column takes the width the fixed columns leave: it carries the most (the command
line, the agent's telemetry).
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputop.core.model import Snapshot
from gputop.tui.view.rows import COLUMNS, DESCENDING, SORTS, Row, build_rows
from gputop.tui.widgets.direct_lines import DirectLines
from gputop.tui.widgets.scroll_range import set_virtual_size

_RIGHT = {key for key, _, _, right in COLUMNS if right}
CURSOR_MARK = "›"
TAG_MARK = "*"  # a tagged row (space): k signals every tagged process
TAGGED_CURSOR_MARK = "»"
VALUES_PERIOD = 1.9  # seconds of snapshot time between redraws of numbers alone
COMMAND_MIN = 12
FIXED_WIDTH = sum((w or 0) + 1 for _, _, w, _ in COLUMNS)  # every column but the command
WIDTHS = {key: w for key, _, w, _ in COLUMNS}
WIDENED = ("gpu_mem", "sm")  # number columns that may say "n/a (MIG)"
WIDEST = 9


class Cell:
    """One cell's text as drawn (``.plain``), as DataTable's cells were read."""

    __slots__ = ("plain",)

    def __init__(self, plain: str) -> None:
        self.plain = plain

    def __repr__(self) -> str:
        return f"Cell({self.plain!r})"


def cell_text(key: str, value: str, width: int) -> str:
    """A cell padded or cut to ``width``: numbers on the right, text after a space."""
    text = value if key in _RIGHT else " " + value
    size = cell_len(text)
    if size > width:
        return set_cell_size(text, width)
    pad = " " * (width - size)
    return pad + text if key in _RIGHT else text + pad


def _structure(snapshot: Snapshot) -> tuple:
    """What the order of rows sorted by GPU or pid depends on: the processes on each GPU,
    their parents and workers, and the job and rank their agents report."""
    def proc(p) -> tuple:
        a = p.agent
        job = (a.job_id, a.rank, a.local_rank, a.world_size, a.local_world_size) \
            if a is not None else None
        return p.pid, p.ppid, tuple(w.pid for w in p.workers), job

    return (tuple((g.index, tuple(proc(p) for p in g.processes)) for g in snapshot.gpus),
            tuple(proc(p) for p in snapshot.other_processes))


class ProcessTable(DirectLines, ScrollView, can_focus=True):
    DEFAULT_CSS = """
    ProcessTable { height: 1fr; overflow-x: hidden; scrollbar-size-vertical: 1; }
    ProcessTable > .process-table--header { text-style: bold; background: $panel; }
    ProcessTable > .process-table--cursor { background: $block-cursor-background;
                                            color: $block-cursor-foreground; }
    ProcessTable:blur > .process-table--cursor { background: $block-cursor-blurred-background;
                                                 color: $foreground; }
    """
    COMPONENT_CLASSES = {"process-table--header", "process-table--cursor"}
    BINDINGS = [
        Binding("enter", "select_cursor", "Process"),
        Binding("up", "cursor(-1)", show=False),
        Binding("down", "cursor(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "cursor_to(0)", show=False),
        Binding("end", "cursor_to(-1)", show=False),
    ]

    class RowSelected(Message):
        """Enter (or a click on the selected row): open the process under the cursor."""

        def __init__(self, row: Row) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_key = SORTS[0][1]
        self.reverse = False
        self.tree_view = True
        self.needle = ""
        self.everyone = False  # key a: processes on no GPU that are no GPU job's too
        self.tagged: set[str] = set()  # row keys tagged with space
        self.snapshot: Snapshot | None = None
        self.rows_by_key: dict[str, Row] = {}
        self.order: list[str] = []  # row keys in display order
        self.cursor = 0
        self.marks: dict[int, str] = {}  # pid -> severity of the worst finding about it
        self._values_time: float | None = None
        self._structure: tuple | None = None  # of the snapshot the rows were built from
        self._texts: dict[str, str] = {}  # row key -> its line as drawn (without the cursor)
        self._strips: dict[tuple[str, bool], Strip] = {}
        self._header: Strip | None = None
        self._styles: tuple[Style, Style, Style] | None = None
        self._widths: list[int] = []
        self._need: dict[str, int] = {}  # GPU MEM and SM widened for "n/a (MIG)"

    # -- what DataTable offered, for the app and the tests ---------------------------------

    @property
    def rows(self) -> dict[str, Row]:
        return {key: self.rows_by_key[key] for key in self.order}

    @property
    def row_count(self) -> int:
        return len(self.order)

    def get_row_index(self, key: str) -> int:
        return self.order.index(key)

    def get_row_at(self, index: int) -> list[Cell]:
        """The row's cells, unpadded (text columns start with their gap)."""
        values = self._cell_values(self.rows_by_key[self.order[index]], index)
        return [Cell(v if key in _RIGHT else " " + v) for (key, _, _, _), v in
                zip(COLUMNS, values)]

    def get_cell(self, key: str, column: str) -> Cell:
        cells = self.get_row_at(self.order.index(key))
        return cells[[k for k, _, _, _ in COLUMNS].index(column)]

    def selected_row(self) -> Row | None:
        if not self.order:
            return None
        return self.rows_by_key.get(self.order[min(self.cursor, len(self.order) - 1)])

    def move_cursor(self, *, row: int, scroll: bool = True) -> None:
        if not self.order:
            return
        row = max(0, min(row, len(self.order) - 1))
        if row != self.cursor:
            old, self.cursor = self.cursor, row
            self._refresh_row(old)
            self._refresh_row(row)
        if scroll:
            self._scroll_to_cursor()

    # -- view state (keys s, S, t, /) -------------------------------------------------------

    def cycle_sort(self) -> str:
        keys = [k for _, k in SORTS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.reverse = False
        self._header = None
        self.refresh_rows()
        return dict((k, n) for n, k in SORTS)[self.sort_key]

    def flip_sort(self) -> None:
        self.reverse = not self.reverse
        self._header = None
        self.refresh_rows()

    def toggle_tree(self) -> bool:
        self.tree_view = not self.tree_view
        self.refresh_rows()
        return self.tree_view

    def toggle_tag(self, keys: list[str] | None = None) -> int:
        """Tag the selected row (or ``keys``), or untag it when it is tagged; the number of
        tagged rows."""
        if keys is None:
            row = self.selected_row()
            keys = [row.key] if row is not None else []
        if keys and all(k in self.tagged for k in keys):
            self.tagged -= set(keys)
        else:
            self.tagged |= set(keys)
        for key in keys:
            if key in self.rows_by_key:
                self._refresh_row(self.order.index(key))
        return len(self.tagged)

    def tagged_rows(self) -> list[Row]:
        """The tagged rows still shown, in display order."""
        return [self.rows_by_key[k] for k in self.order if k in self.tagged]

    def toggle_everyone(self) -> bool:
        self.everyone = not self.everyone
        self.refresh_rows()
        return self.everyone

    def set_filter(self, needle: str) -> None:
        self.needle = needle
        self.refresh_rows()

    def set_marks(self, marks: dict[int, str]) -> None:
        """Mark the rows of processes with findings (at once, not at the numbers' pace)."""
        if marks != self.marks:
            self.marks = dict(marks)
            self.refresh_rows()

    # -- data -------------------------------------------------------------------------------

    def update_snapshot(self, snapshot: Snapshot) -> None:
        """Show a new snapshot. Rows that appear, end or move are applied at once; when only
        numbers changed, they are redrawn at most every VALUES_PERIOD seconds of snapshot
        time: per-process numbers sampled over one second are too jumpy to read at 1 Hz."""
        self.snapshot = snapshot
        if (self._values_time is not None
                and 0 <= snapshot.time - self._values_time < VALUES_PERIOD
                and self._same_rows(snapshot)):
            return
        self._values_time = snapshot.time
        self.refresh_rows()

    def _same_rows(self, snapshot: Snapshot) -> bool:
        # Sorted by GPU or pid and not filtered, the rows follow from which processes,
        # workers and job ranks there are, not from their numbers: compare those first.
        structure = _structure(snapshot) if (self.sort_key in ("gpu", "pid")
                                              and not self.needle.strip()) else None
        if structure is not None and structure == self._structure:
            return True
        rows = build_rows(snapshot, self.sort_key, self.reverse, self.tree_view, self.needle,
                          self.marks, self.everyone)
        same = [r.key for r in rows] == self.order
        if same and structure is not None:
            self._structure = structure  # the same rows: not built again next tick
        return same

    def refresh_rows(self) -> None:
        if self.snapshot is None:
            return
        rows = build_rows(self.snapshot, self.sort_key, self.reverse, self.tree_view, self.needle,
                          self.marks, self.everyone)
        self._fit_values(rows)
        self._structure = _structure(self.snapshot)
        selected = self.selected_row()
        order = [r.key for r in rows]
        self.rows_by_key = {r.key: r for r in rows}
        self.tagged &= set(self.rows_by_key)  # a process that ended is no longer tagged
        if order != self.order:
            self.order = order
            if selected is not None and selected.key in self.rows_by_key:
                self.cursor = order.index(selected.key)
            self.cursor = max(0, min(self.cursor, len(order) - 1))
            self._texts = {}
            self._strips = {}
            self._set_virtual_size()
            self.refresh()
            self.call_after_refresh(self._scroll_to_cursor)  # the selection stays in view
            return
        regions = []  # one refresh for them all: each call walks up to the screen
        for index, key in enumerate(order):
            text = self._line_text(self.rows_by_key[key], index)
            if self._texts.get(key) != text:
                region = self._stale_row(index)
                self._texts[key] = text  # drawn from this text, not made again
                if region is not None:
                    regions.append(region)
        if regions:
            self.refresh(*regions)

    # -- drawing ----------------------------------------------------------------------------

    def _fit_values(self, rows: list[Row]) -> None:
        """Widen GPU MEM and SM while a row says "n/a (MIG)" (and narrow them again)."""
        need = {key: min(WIDEST, max((len(r.cells.get(key, "")) for r in rows), default=0))
                for key in WIDENED}
        if need != self._need:
            self._need = need
            self._layout()

    def _layout(self) -> None:
        width = self.scrollable_content_region.width or self.size.width
        extra = {key: max(0, n - WIDTHS[key]) for key, n in self._need.items()}
        command = max(COMMAND_MIN, width - FIXED_WIDTH - sum(extra.values()))
        widths = [(w + extra.get(key, 0) + 1) if w else command for key, _, w, _ in COLUMNS]
        if widths != self._widths:
            self._widths = widths
            self._texts, self._strips, self._header = {}, {}, None
            self.refresh()

    def on_resize(self) -> None:
        self._layout()
        self._set_virtual_size()
        # The selected row stays on screen whatever the new size (k and Enter act on it).
        self.call_after_refresh(self._scroll_to_cursor)

    def _set_virtual_size(self) -> None:
        """Rows and the header, but never less than the view: a new virtual size lays out the
        whole screen again, and while the rows fit, a row that comes or goes changes
        nothing but the rows."""
        set_virtual_size(self, Size(self.size.width, max(len(self.order) + 1, self.size.height)))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._strips, self._header = {}, None

    def _cell_values(self, row: Row, index: int) -> list[str]:
        values = []
        for key, _, _, _ in COLUMNS:
            if key == "mark":
                tagged = row.key in self.tagged
                if index == self.cursor:
                    values.append(TAGGED_CURSOR_MARK if tagged else CURSOR_MARK)
                else:
                    values.append(TAG_MARK if tagged else "")
            else:
                values.append(row.cells.get(key, ""))
        return values

    def _cells(self, row: Row, index: int) -> list[Cell]:
        if not self._widths:
            self._layout()
        return [Cell(cell_text(key, value, width)) for (key, _, _, _), value, width in
                zip(COLUMNS, self._cell_values(row, index), self._widths)]

    def _line_text(self, row: Row, index: int) -> str:
        return "".join(c.plain for c in self._cells(row, index))

    def _refresh_row(self, index: int) -> None:
        """Repaint row ``index`` if it is on screen (line 0 is the header)."""
        region = self._stale_row(index)
        if region is not None:
            self.refresh(region)

    def _stale_row(self, index: int) -> Region | None:
        """Forget how row ``index`` was drawn; its region, if it is on screen."""
        if not 0 <= index < len(self.order):
            return None
        key = self.order[index]
        self._texts.pop(key, None)
        self._strips.pop((key, True), None)
        self._strips.pop((key, False), None)
        y = index - self.scroll_offset.y + 1
        return Region(0, y, self.size.width, 1) if 1 <= y < self.size.height else None

    def _style_set(self) -> tuple[Style, Style, Style]:
        if self._styles is None:
            base = self.rich_style
            header = base + self.get_component_rich_style("process-table--header",
                                                          partial=True)
            cursor = base + self.get_component_rich_style("process-table--cursor",
                                                          partial=True)
            self._styles = (self.filtered(base), self.filtered(header), self.filtered(cursor))
        return self._styles

    def render_line(self, y: int) -> Strip:
        if not self._widths:
            self._layout()
        base, header, cursor = self._style_set()
        width = self.line_width()
        if y == 0:
            if self._header is None:
                text = "".join(cell_text(key, self._label(key, label), w) for
                               (key, label, _, _), w in zip(COLUMNS, self._widths))
                self._header = Strip([Segment(text, header)]).adjust_cell_length(width, header)
            return self._header
        index = self.scroll_offset.y + y - 1
        if not 0 <= index < len(self.order):
            return Strip.blank(width, base)
        key = self.order[index]
        selected = index == self.cursor
        strip = self._strips.get((key, selected))
        if strip is None:
            text = self._texts.get(key)
            if text is None:
                text = self._texts[key] = self._line_text(self.rows_by_key[key], index)
            style = cursor if selected else base
            strip = Strip([Segment(text, style)]).adjust_cell_length(width, style)
            self._strips[(key, selected)] = strip
        return strip

    def _label(self, key: str, label: str) -> str:
        if key == self.sort_key:
            descending = (key in DESCENDING) != self.reverse
            label += "▼" if descending else "▲"
        return label

    # -- keys and mouse ---------------------------------------------------------------------

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.size.height - 1)
        top = self.scroll_offset.y
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False, immediate=True)

    def action_cursor(self, step: int) -> None:
        self.move_cursor(row=self.cursor + step)

    def action_page(self, step: int) -> None:
        self.move_cursor(row=self.cursor + step * max(1, self.size.height - 2))

    def action_cursor_to(self, row: int) -> None:
        self.move_cursor(row=row if row >= 0 else len(self.order) - 1)

    def action_select_cursor(self) -> None:
        row = self.selected_row()
        if row is not None:
            self.post_message(self.RowSelected(row))

    def on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y - 1
        if event.y >= 1 and 0 <= index < len(self.order):
            if index == self.cursor and event.chain >= 2:
                self.action_select_cursor()
            self.move_cursor(row=index, scroll=False)
