"""The process table: GPU processes with their DataLoader workers, keyed by pid.

Each update touches only the cells that changed (update_cell), removes rows of processes that
ended, appends new ones and reorders only when the order changed, so the selection and the
scroll position survive every tick.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.widgets import DataTable

from gputop.model import Snapshot
from gputop.tui.rows import COLUMNS, DESCENDING, SORTS, Row, build_rows

_RIGHT = {key for key, _, _, right in COLUMNS if right}
CURSOR_MARK = "›"
VALUES_PERIOD = 1.9  # seconds of snapshot time between redraws of numbers alone


class Cell:
    """A table cell that renders as one ready segment.

    DataTable re-renders every visible cell after any update; a Rich Text cell goes through
    wrapping and justification each time, which made the table the costliest part of a frame.
    This cell only pads or cuts its text to the column width.
    """

    __slots__ = ("plain", "right")

    def __init__(self, plain: str, right: bool = False) -> None:
        self.plain = plain
        self.right = right

    def __rich_console__(self, console, options):
        width = options.max_width
        text = self.plain
        size = cell_len(text)
        if size > width:
            text, size = set_cell_size(text, width), width
        pad = " " * (width - size)
        yield Segment(pad + text if self.right else text + pad)

    def __rich_measure__(self, console, options) -> Measurement:
        size = cell_len(self.plain)
        return Measurement(size, size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cell) and (self.plain, self.right) == (other.plain, other.right)

    def __hash__(self) -> int:
        return hash((self.plain, self.right))

    def __repr__(self) -> str:
        return f"Cell({self.plain!r})"


class ProcessTable(DataTable):
    DEFAULT_CSS = """
    ProcessTable { height: 1fr; overflow-x: hidden; scrollbar-size-vertical: 1; }
    """
    BINDINGS = [Binding("enter", "select_cursor", "Process")]

    def __init__(self, *, id: str | None = None) -> None:
        # No cell padding: each column carries its own one-space gap, which saves a column of
        # width per field at 80 columns.
        super().__init__(id=id, cursor_type="row", zebra_stripes=False, cell_padding=0)
        self.sort_key = SORTS[0][1]
        self.reverse = False
        self.tree_view = True
        self.needle = ""
        self.snapshot: Snapshot | None = None
        self.rows_by_key: dict[str, Row] = {}
        self._order: list[str] = []
        self._cells: dict[str, dict[str, str]] = {}
        self._marked: str | None = None
        self._applying = False
        self._rich_style_memo: Style | None = None
        self._values_time: float | None = None
        self.marks: dict[int, str] = {}  # pid -> severity of the worst finding about it

    # DataTable asks for its Rich style once per line painted, and computing it walks every
    # ancestor's styles; it changes only when this widget's styles are applied again.
    @property
    def rich_style(self) -> Style:
        if self._rich_style_memo is None:
            self._rich_style_memo = super().rich_style
        return self._rich_style_memo

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._rich_style_memo = None

    def on_mount(self) -> None:
        for key, label, width, _ in COLUMNS:
            self.add_column(self._label(key, label), key=key, width=(width or 20) + 1)
        self.fit_command_column()

    # -- view state (keys s, S, t, /) -------------------------------------------------------

    def _label(self, key: str, label: str) -> Cell:
        if key == self.sort_key:
            descending = (key in DESCENDING) != self.reverse
            label += "▼" if descending else "▲"
        return self._cell(key, label)

    def _relabel(self) -> None:
        for key, label, _, _ in COLUMNS:
            self.columns[key].label = self._label(key, label)
        self._require_update_dimensions = True
        self.refresh()

    def cycle_sort(self) -> str:
        keys = [k for _, k in SORTS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.reverse = False
        self._relabel()
        self.refresh_rows()
        return dict((k, n) for n, k in SORTS)[self.sort_key]

    def flip_sort(self) -> None:
        self.reverse = not self.reverse
        self._relabel()
        self.refresh_rows()

    def toggle_tree(self) -> bool:
        self.tree_view = not self.tree_view
        self.refresh_rows()
        return self.tree_view

    def set_filter(self, needle: str) -> None:
        self.needle = needle
        self.refresh_rows()

    def set_marks(self, marks: dict[int, str]) -> None:
        """Mark the rows of processes with findings (at once, not at the numbers' pace)."""
        if marks != self.marks:
            self.marks = dict(marks)
            self.refresh_rows()

    def on_resize(self) -> None:
        self.fit_command_column()

    def fit_command_column(self) -> None:
        """Give the command column the width left over (on mount and on resize only)."""
        if "command" not in self.columns:
            return
        fixed = sum((w or 0) + 1 for _, _, w, _ in COLUMNS)
        room = self.size.width - fixed - 1  # the vertical scrollbar
        column = self.columns["command"]
        column.width = max(20, room)
        column.auto_width = False
        self._require_update_dimensions = True
        self.refresh()

    # -- data -------------------------------------------------------------------------------

    def selected_row(self) -> Row | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # an empty or shrinking table has no valid cursor cell
            return None
        return self.rows_by_key.get(key)

    def update_snapshot(self, snapshot: Snapshot) -> None:
        """Show a new snapshot. Rows that appear, end or move are applied at once; when only
        numbers changed, they are redrawn at most every VALUES_PERIOD seconds of snapshot
        time: DataTable repaints every visible cell after any update, which made it the
        costliest part of a 1 s frame, and per-process numbers sampled over one second are
        too jumpy to read at that pace anyway."""
        self.snapshot = snapshot
        if (self._values_time is not None
                and 0 <= snapshot.time - self._values_time < VALUES_PERIOD
                and self._same_rows(snapshot)):
            return
        self._values_time = snapshot.time
        self.refresh_rows()

    def _same_rows(self, snapshot: Snapshot) -> bool:
        rows = build_rows(snapshot, self.sort_key, self.reverse, self.tree_view, self.needle,
                          self.marks)
        return [r.key for r in rows] == self._order

    def refresh_rows(self) -> None:
        if self.snapshot is None:
            return
        rows = build_rows(self.snapshot, self.sort_key, self.reverse, self.tree_view, self.needle,
                          self.marks)
        self._apply(rows)

    def _cell(self, key: str, value: str) -> Cell:
        if key in _RIGHT:
            return Cell(value, right=True)
        return Cell(" " + value)

    def _apply(self, rows: list[Row]) -> None:
        selected = self.selected_row()
        self._applying = True
        try:
            self._apply_rows(rows, selected)
        finally:
            self._applying = False
        self._mark_cursor()

    def _apply_rows(self, rows: list[Row], selected: Row | None) -> None:
        wanted = [r.key for r in rows]
        wanted_set = set(wanted)
        for key in [k for k in self._order if k not in wanted_set]:
            self.remove_row(key)
            self._cells.pop(key, None)
        self._order = [k for k in self._order if k in wanted_set]
        for row in rows:
            old = self._cells.get(row.key)
            if old is None:
                values = [self._cell(key, row.cells.get(key, "")) for key, _, _, _ in COLUMNS]
                self.add_row(*values, key=row.key)
                self._order.append(row.key)
            else:
                for key, value in row.cells.items():
                    if old.get(key) != value:
                        self.update_cell(row.key, key, self._cell(key, value))
            self._cells[row.key] = dict(row.cells, mark=(self._cells.get(row.key) or {}).get(
                "mark", ""))
        self.rows_by_key = {r.key: r for r in rows}
        if self._order != wanted:
            rank = {key: i for i, key in enumerate(wanted)}
            self.sort("pid", key=lambda pid: rank[pid.plain])
            self._order = wanted
            if selected is not None and selected.key in rank:
                self.move_cursor(row=rank[selected.key], scroll=False)

    def _mark_cursor(self) -> None:
        """A visible cursor mark: without colour (NO_COLOR) the highlight alone would vanish."""
        if self._applying:
            return
        current = self.selected_row()
        key = current.key if current and current.key in self._cells else None
        if key == self._marked:
            return
        if self._marked in self._cells:
            self.update_cell(self._marked, "mark", self._cell("mark", ""))
            self._cells[self._marked]["mark"] = ""
        if key is not None:
            self.update_cell(key, "mark", self._cell("mark", CURSOR_MARK))
            self._cells[key]["mark"] = CURSOR_MARK
        self._marked = key

    def watch_cursor_coordinate(self, old, new) -> None:
        super().watch_cursor_coordinate(old, new)
        self._mark_cursor()
