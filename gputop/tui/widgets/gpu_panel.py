"""Every GPU in one widget: the cards (borders included) or, in compact mode, one line each.

One widget rather than a card widget per GPU: Textual renders, styles and composites every
widget a repaint touches, and eight bordered cards cost eight times that work per tick. Here a
tick computes the lines (gputop/tui/widgets/cards.py), compares them with the lines on screen, and
repaints only the cells of the lines that changed; unchanged lines keep their ready strips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputop.core.model import GpuSample
from gputop.tui.view.frames import Points
from gputop.tui.view.layout import Plan
from gputop.tui.widgets.cards import (
    CHART_FIELDS,
    Line,
    card_lines,
    chart_heights,
    chart_limit,
    chart_width_of,
    compact_pieces,
    compact_spark_width,
)
from gputop.tui.widgets.direct_lines import DirectLines

# A braille cell with no dot: what a chart row shows where there is no sample.
_NO_DOTS = chr(0x2800)
# Roles of cards.py that are plain Rich styles (the rest come from the theme).
_PLAIN = {"green": "green", "yellow": "yellow", "red": "red", "dim": "dim", "bold": "bold",
          "title": "bold", "warning-bold": "bold yellow", "error-bold": "bold red",
          "spark": "cyan", "busy": "cyan"}


def split_width(width: int, columns: int) -> list[int]:
    """Card widths across a row: equal, the first ones one cell wider with a remainder."""
    base, extra = divmod(width, max(1, columns))
    return [base + (1 if i < extra else 0) for i in range(columns)]


def no_data_rows(limit: float, width: int, height: int) -> list[str]:
    """The rows ``chart_rows`` draws for a series with no sample yet, without the chart module:
    the first frame is drawn from the first sample, before the history."""
    if not limit:
        return ["n/a".center(width)] + [""] * (height - 1)
    if height == 1:
        return [" " * width]
    return [_NO_DOTS * width] * height


def changed_span(old: Line, new: Line) -> tuple[int, int] | None:
    """The cells [start, end) of a line that differ, or None for the whole line (a change of
    style or of a piece's length, which may move a wide character). Pieces are compared
    first: most of a line's pieces are the same objects or equal."""
    if len(old) != len(new):
        return None
    offset = 0
    first = last = None  # (offset, old text, new text) of the first and last changed piece
    for (a, role_a), (b, role_b) in zip(old, new):
        if role_a != role_b or len(a) != len(b):
            return None
        if a != b:
            if first is None:
                first = (offset, a, b)
            last = (offset, a, b)
        offset += len(a)
    if first is None:
        return 0, 0
    start, a, b = first
    i = 0
    while a[i] == b[i]:  # a != b and as long: they differ somewhere
        i += 1
    end, a, b = last
    j = len(a)
    while a[j - 1] == b[j - 1]:
        j -= 1
    return start + i, end + j


def merged(line: Line) -> list[tuple[str, str | None]]:
    """Neighbouring pieces of one role as one: a card row is ~30 pieces, and every segment
    is an object the compositor cuts and the garbage collector walks."""
    out: list[tuple[str, str | None]] = []
    for text, role in line:
        if out and out[-1][1] == role:
            out[-1] = (out[-1][0] + text, role)
        else:
            out.append((text, role))
    return out


class GpuPanel(DirectLines, ScrollView, can_focus=False):
    DEFAULT_CSS = """
    GpuPanel { height: 8; overflow-x: hidden; scrollbar-size-vertical: 1; }
    """
    COMPONENT_CLASSES = {
        "gpu-panel--border", "gpu-panel--warning", "gpu-panel--error",
        *(f"gpu-panel--{field}" for field in CHART_FIELDS),
    }

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.plan: Plan | None = None
        self.gpus: tuple[GpuSample, ...] = ()
        self.series: Mapping[int, Mapping[str, Points]] = {}
        self.span = (0.0, 0.0)
        self.marks: dict[int, str] = {}  # GPU index -> severity of its worst finding
        self.lines: list[Line] = []  # every line of the panel, scrolled or not
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str | None, Style] | None = None
        self._limits: dict[tuple[int, str], float | None] = {}  # a lost GPU keeps its tops
        self._charts: tuple[tuple, dict[int, dict[str, list[str]]]] | None = None
        self._width = 0

    # -- data in ----------------------------------------------------------------------------

    def set_plan(self, plan: Plan) -> None:
        if plan != self.plan:
            self.plan = plan
            self._redraw()

    def show(self, gpus: Sequence[GpuSample], series: Mapping[int, Mapping[str, Points]],
             start: float, end: float) -> None:
        self.gpus, self.series, self.span = tuple(gpus), series, (start, end)
        for gpu in self.gpus:
            for field in CHART_FIELDS:
                limit = chart_limit(gpu, field) or self._limits.get((gpu.index, field))
                self._limits[(gpu.index, field)] = limit
        self._redraw()

    def set_marks(self, marks: Mapping[int, str]) -> None:
        if dict(marks) != self.marks:
            self.marks = dict(marks)
            self._redraw()

    def mark_of(self, index: int) -> str | None:
        return self.marks.get(index)

    def on_resize(self) -> None:
        self._redraw()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._strips = {}

    # -- lines ------------------------------------------------------------------------------

    def _all_charts(self, widths: dict[int, int], heights: list[int]
                    ) -> dict[int, dict[str, list[str]]]:
        """The chart rows of every GPU's fields, ``widths[index]`` cells wide; again only
        when the data or the geometry changed. The GPUs are sampled together, so their series
        share their times: charts as wide are binned in one pass (a pass per GPU cost eight
        times the work)."""
        start, end = self.span
        points: dict[int, list[Points | None]] = {}
        limits: dict[int, list[float]] = {}
        for gpu in self.gpus:
            series = self.series.get(gpu.index, {})
            points[gpu.index] = [series.get(field) for field in CHART_FIELDS]
            limits[gpu.index] = [self._limits.get((gpu.index, field)) or 0.0
                                 for field in CHART_FIELDS]
        key = (tuple((i, tuple((0, None, None) if p is None or not len(p[0]) else
                               (len(p[0]), float(p[0][-1]),
                                float(p[1][-1]) if len(p[1]) else None) for p in ps),
                      tuple(limits[i])) for i, ps in points.items()),
               start, end, tuple(widths.items()), tuple(heights))
        if self._charts is not None and self._charts[0] == key:
            return self._charts[1]
        charts: dict[int, dict[str, list[str]]] = {}
        together: dict[int, list[int]] = {}  # width -> GPUs whose fields share t0's times
        t0 = None
        for index, ps in points.items():
            width = widths[index]
            if all(p is None or not len(p[0]) for p in ps):  # no sample yet: nothing to bin
                charts[index] = dict(zip(CHART_FIELDS, (
                    no_data_rows(m, width, h) for m, h in zip(limits[index], heights))))
                continue
            t = next(p[0] for p in ps if p is not None and len(p[0]))
            if t0 is None:
                t0 = t
            # Cut from series recorded at the same ticks: as many points, from the same first
            # to the same last time, are the same times.
            if all(p is not None and len(p[0]) == len(t0) and (p[0] is t0 or (
                    p[0][0] == t0[0] and p[0][-1] == t0[-1])) for p in ps):
                together.setdefault(width, []).append(index)
            else:
                charts[index] = self._charts_apart(ps, limits[index], width, heights)
        for width, gpus in together.items():
            from gputop.tui.widgets.chart import chart_rows_many

            rows = chart_rows_many(t0, [p[1] for i in gpus for p in points[i]], start, end,
                                   [m for i in gpus for m in limits[i]], width=width,
                                   heights=heights * len(gpus))
            n = len(CHART_FIELDS)
            for k, index in enumerate(gpus):
                charts[index] = dict(zip(CHART_FIELDS, rows[k * n:(k + 1) * n]))
        self._charts = (key, charts)
        return charts

    def _charts_apart(self, points: list[Points | None], limits: list[float], width: int,
                      heights: list[int]) -> dict[str, list[str]]:
        """One GPU whose fields do not share their times (a GPU seen later than the others)."""
        from gputop.tui.widgets.chart import chart_rows

        empty: tuple[float, ...] = ()
        start, end = self.span
        return {field: chart_rows(*(p if p is not None else (empty, empty)), start, end, m,
                                  width=width, height=h)
                for field, p, m, h in zip(CHART_FIELDS, points, limits, heights)}

    def _compute(self, width: int) -> list[Line]:
        plan = self.plan
        if plan is None or not self.gpus or width <= 0:
            return []
        if plan.compact:
            spark_width = compact_spark_width(width)
            start, end = self.span
            out = []
            for gpu in self.gpus:
                sparks = {}
                for field in ("util_gpu", "mem_used", "power_w", "pcie_rx_mbs"):
                    points = self.series.get(gpu.index, {}).get(field)
                    if points is None or not len(points[0]):
                        sparks[field] = " " * spark_width  # no sample yet
                        continue
                    from gputop.tui.widgets.chart import spark_series

                    limit = self._limits.get((gpu.index, field)) or 0.0
                    sparks[field] = spark_series(*points, start, end, limit, spark_width)
                out.append(compact_pieces(gpu, sparks, width, spark_width))
            return out
        columns = max(1, plan.columns)
        widths = split_width(width, columns)
        height = plan.card_height
        heights = chart_heights(height)
        charts = self._all_charts(
            {gpu.index: chart_width_of(widths[n % columns]) for n, gpu in enumerate(self.gpus)},
            heights)
        out: list[Line] = []
        for first in range(0, len(self.gpus), columns):
            row = self.gpus[first:first + columns]
            cards = []
            for gpu, card_width in zip(row, widths):
                cards.append(card_lines(gpu, charts[gpu.index], card_width, height,
                                        self.marks.get(gpu.index)))
            pad = width - sum(widths[:len(row)])
            for y in range(height):
                line: tuple = tuple(piece for card in cards for piece in card[y])
                if pad > 0:
                    line += ((" " * pad, None),)
                out.append(line)
        return out

    def _redraw(self) -> None:
        """Compute every line; repaint only the cells that differ from the screen."""
        region = self.scrollable_content_region
        width = region.width if region.width > 0 else self.size.width
        if width <= 0:
            return
        lines = self._compute(width)
        if width != self._width or len(lines) != len(self.lines):
            self._width = width
            self.lines = lines
            self._strips = {}
            self.virtual_size = Size(width, len(lines))
            self.refresh()
            return
        scroll_y = self.scroll_offset.y
        visible = range(scroll_y, scroll_y + self.size.height)
        regions = []
        for y, (old, new) in enumerate(zip(self.lines, lines)):
            if old == new:
                continue
            self._strips.pop(y, None)
            if y in visible:
                span = changed_span(old, new)
                start, end = span if span is not None else (0, width)
                if end > start:
                    regions.append(Region(start, y - scroll_y, end - start, 1))
        self.lines = lines
        if regions:
            self.refresh(*regions)  # one call: each call walks up to the screen

    # -- painting ---------------------------------------------------------------------------

    def _style_map(self) -> dict[str | None, Style]:
        if self._styles is None:
            base = self.rich_style
            styles: dict[str | None, Style] = {None: base}
            for role, spec in _PLAIN.items():
                styles[role] = base + Style.parse(spec)
            for role in ("border", "warning", "error", *CHART_FIELDS):
                styles[role] = base + self.get_component_rich_style(f"gpu-panel--{role}",
                                                                     partial=True)
            self._styles = {role: self.filtered(style) for role, style in styles.items()}
        return self._styles

    def render_line(self, y: int) -> Strip:
        index = self.scroll_offset.y + y
        strip = self._strips.get(index)
        if strip is None:
            styles = self._style_map()
            width = self.line_width()
            if index >= len(self.lines):
                strip = Strip.blank(width, styles[None])
            else:
                base = styles[None]
                segments = [Segment(text, styles.get(role, base))
                            for text, role in merged(self.lines[index])]
                if width == self._width:  # lines are built exactly this wide
                    strip = Strip(segments, width)
                else:
                    strip = Strip(segments).adjust_cell_length(width, base)
            self._strips[index] = strip
        return strip


__all__ = ["GpuPanel", "changed_span", "split_width"]
