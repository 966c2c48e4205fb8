"""One GPU as a card: gauges with numbers beside live charts of utilization, memory, power and
PCIe, then temperature and clocks, and throttling or GPM activity. Renders what it is given."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from gputop.format import mbs_h, num, pct
from gputop.model import GpuSample
from gputop.tui.frames import CHART_FIELDS, Points
from gputop.tui.widgets.chart import chart_rows
from gputop.tui.widgets.gauges import (
    bar,
    gauge_line,
    level_style,
    mem_text,
    pcie_link_max_mbs,
    power_text,
    ratio,
    temp_text,
    throttle_reasons,
)

GAUGE_WIDTH = 15
_EMPTY = np.zeros(0)
# Temperatures are shown against this: data-centre GPUs slow down around 85-90 C.
TEMP_SCALE_C = 95.0
_LABELS = {"util_gpu": "util", "mem_used": "mem", "power_w": "pwr", "pcie_rx_mbs": "pcie"}


def _style(style: str | Style | None) -> Style | None:
    if not style:
        return None
    return style if isinstance(style, Style) else Style.parse(style)


def text_segments(text: Text) -> list[Segment]:
    """A one-line Text as segments, without Rich's wrapping machinery (spans do not overlap
    in the texts built here)."""
    plain, base = text.plain, _style(text.style)
    if not text.spans:
        return [Segment(plain, base)] if plain else []
    out: list[Segment] = []
    position = 0
    for span in sorted(text.spans, key=lambda s: s.start):
        if span.start > position:
            out.append(Segment(plain[position:span.start], base))
        style = _style(span.style)
        out.append(Segment(plain[span.start:span.end], base + style if base and style
                           else style or base))
        position = max(position, span.end)
    if position < len(plain):
        out.append(Segment(plain[position:], base))
    return out


def changed_region(y: int, new: tuple[Text, str, str], old: tuple[Text, str, str],
                   width: int) -> Region:
    """The cells of line ``y`` that differ: the gauge part, the chart part, or both."""
    if new[0] != old[0] or len(new[1]) != len(old[1]):
        left = 0
    else:
        left = GAUGE_WIDTH + 1 + next(i for i, (a, b) in enumerate(zip(new[1], old[1])) if a != b)
    right = width
    if new[1] == old[1]:
        right = GAUGE_WIDTH + 1
    elif len(new[1]) == len(old[1]):
        last = next(i for i in range(len(new[1]) - 1, -1, -1) if new[1][i] != old[1][i])
        right = GAUGE_WIDTH + 1 + last + 1
    return Region(left, y, max(1, right - left), 1)


def chart_limit(gpu: GpuSample, field: str) -> float | None:
    """The fixed top of each chart, so one glance compares GPUs."""
    return {
        "util_gpu": 100.0,
        "mem_used": float(gpu.mem_total) if gpu.mem_total else None,
        "power_w": gpu.power_limit_w,
        "pcie_rx_mbs": pcie_link_max_mbs(gpu),
    }[field]


def gauge_text(gpu: GpuSample, field: str, width: int = GAUGE_WIDTH) -> Text:
    label = _LABELS[field]
    if gpu.lost:
        return gauge_line(label, "lost", None, width, "dim")
    if field == "util_gpu":
        return gauge_line(label, pct(gpu.util_gpu), ratio(gpu.util_gpu, 100.0), width)
    if field == "mem_used":
        return gauge_line(label, mem_text(gpu), ratio(gpu.mem_used, gpu.mem_total), width)
    if field == "power_w":
        return gauge_line(label, power_text(gpu), ratio(gpu.power_w, gpu.power_limit_w), width)
    rx = f"rx {mbs_h(gpu.pcie_rx_mbs)}" if gpu.pcie_rx_mbs is not None else "n/a"
    return gauge_line(label, rx, ratio(gpu.pcie_rx_mbs, pcie_link_max_mbs(gpu)), width)


def info_text(gpu: GpuSample) -> Text:
    """Temperature gauge and SM clock against its maximum."""
    text = Text("temp ")
    frac = ratio(gpu.temperature_c, TEMP_SCALE_C)
    text.append(bar(frac, 5), style=level_style(frac, 0.8, 0.9))
    text.append(f" {temp_text(gpu):>5}  SM {num(gpu.sm_clock_mhz)}/{num(gpu.sm_clock_max_mhz)} MHz")
    return text


def status_text(gpu: GpuSample) -> Text:
    """Throttling first (a warning), then PCIe TX and GPM activity where the GPU has it."""
    if gpu.lost:
        return Text("LOST: the GPU fell off the bus", style="bold red")
    text = Text()
    reasons = throttle_reasons(gpu)
    if reasons:
        text.append("⚠ " + ", ".join(reasons), style="bold yellow")
        text.append("  ")
    parts = []
    if gpu.pcie_tx_mbs is not None:
        parts.append(f"tx {mbs_h(gpu.pcie_tx_mbs)}")
    if gpu.sm_active is not None:
        parts.append(f"SM act {pct(gpu.sm_active)}")
    if gpu.tensor_active is not None:
        parts.append(f"tensor {pct(gpu.tensor_active)}")
    if gpu.pstate is not None:
        parts.append(f"P{gpu.pstate}")
    text.append("  ".join(parts), style="dim" if not reasons else "")
    return text


class GpuCard(Widget):
    """One widget per GPU, drawn line by line: a card of 15 small widgets costs the compositor
    15 times the work each tick. Lines that did not change are not repainted."""

    DEFAULT_CSS = """
    GpuCard { border: round $secondary; padding: 0 0 0 1; height: 1fr; }
    """
    COMPONENT_CLASSES = {f"gpu-card--{field}" for field in CHART_FIELDS}

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-card-{index}", classes="gpu-card")
        self.index = index
        self._title = ""
        # The last known chart tops: a lost GPU no longer reports its limits.
        self._limits: dict[str, float | None] = {}
        self._data: tuple | None = None
        self._lines: list[tuple[Text, str, str]] = []  # (gauge part, chart row, chart field)
        self._strips: list[Strip | None] = []
        self._base: Style | None = None
        self._chart_styles: dict[str, Style] = {}

    def update_gpu(self, gpu: GpuSample, series: Mapping[str, Points], start: float,
                   end: float) -> None:
        title = f" {gpu.index} · {gpu.name or '?'} "
        if title != self._title:
            self._title = self.border_title = title
        if gpu.lost != self.has_class("-lost"):
            self.set_class(gpu.lost, "-lost")
        throttled = bool(throttle_reasons(gpu))
        if throttled != self.has_class("-throttled"):
            self.set_class(throttled, "-throttled")
        for field in CHART_FIELDS:
            limit = chart_limit(gpu, field) or self._limits.get(field)
            self._limits[field] = limit
        self._data = (gpu, series, start, end)
        self._layout_lines()

    def on_resize(self) -> None:
        self._layout_lines()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._base = None
        self._chart_styles = {}
        self._strips = [None] * len(self._lines)

    def _layout_lines(self) -> None:
        """Compute every content line; repaint the ones that differ from the screen."""
        width, height = self.size.width, self.size.height
        if self._data is None or width <= 0 or height <= 0:
            return
        gpu, series, start, end = self._data
        chart_width = max(1, width - GAUGE_WIDTH - 1)
        block, extra = divmod(max(0, height - 2), len(CHART_FIELDS))
        lines: list[tuple[Text, str, str]] = []
        for n, field in enumerate(CHART_FIELDS):
            block_height = max(2, block + (1 if n < extra else 0))
            gauge = gauge_text(gpu, field).split("\n")
            t, v = series.get(field, (_EMPTY, _EMPTY))
            rows = chart_rows(t, v, start, end, self._limits.get(field) or 0.0,
                              width=chart_width, height=block_height)
            for i in range(block_height):
                lines.append((gauge[i] if i < len(gauge) else Text(), rows[i], field))
        lines.append((info_text(gpu) if not gpu.lost else Text(), "", ""))
        lines.append((status_text(gpu), "", ""))
        lines = lines[:height]
        if len(lines) != len(self._lines):
            self._strips = [None] * len(lines)
            self._lines = lines
            self.refresh()
            return
        for y, (new, old) in enumerate(zip(lines, self._lines)):
            if new != old:
                self._strips[y] = None
                self.refresh(changed_region(y, new, old, width))
        self._lines = lines

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._base is None:
            self._base = self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, self._base)
        strip = self._strips[y]
        if strip is None:
            gauge, row, field = self._lines[y]
            segments = text_segments(gauge)
            if field:
                pad = GAUGE_WIDTH + 1 - gauge.cell_len
                segments.append(Segment(" " * pad))
                style = self._chart_styles.get(field)
                if style is None:
                    style = self._chart_styles[field] = self.get_component_rich_style(
                        f"gpu-card--{field}", partial=True)
                segments.append(Segment(row, style))
            strip = Strip(segments).apply_style(self._base).adjust_cell_length(width, self._base)
            self._strips[y] = strip
        return strip

    # Kept for findings (a later issue marks the card of the GPU a finding is about).
    def mark(self, severity: str | None) -> None:
        for level in ("info", "warning", "critical"):
            self.set_class(severity == level, f"-finding-{level}")


__all__ = ["GpuCard", "chart_limit"]
