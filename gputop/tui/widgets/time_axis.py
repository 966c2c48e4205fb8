"""A chart's time axis: how long ago each quarter of the chart was, "now" at the right."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


def ago(seconds: float) -> str:
    if seconds < 120:
        return f"-{seconds:.0f}s"
    if seconds < 7200:
        return f"-{seconds / 60:.0f}m"
    return f"-{seconds / 3600:.1f}h"


def axis_text(span: float, width: int) -> str:
    """Labels under a chart ``width`` cells wide spanning ``span`` seconds up to now: at its
    left, its quarters where they fit, "now" at its right."""
    cells = [" "] * max(0, width)
    if width < 8 or span <= 0:
        return "".join(cells)[:width]
    taken: list[tuple[int, int]] = []

    def put(label: str, at: int) -> None:
        start = min(max(0, at), width - len(label))
        end = start + len(label)
        if any(start < b + 1 and a < end + 1 for a, b in taken):
            return  # it would touch a label already there
        cells[start:end] = label
        taken.append((start, end))

    put(ago(span), 0)
    put("now", width - 3)
    for quarter in (2, 1, 3):
        put(ago(span * (4 - quarter) / 4), round((width - 1) * quarter / 4) - 2)
    return "".join(cells)


class TimeAxis(Widget):
    DEFAULT_CSS = "TimeAxis { height: 1; color: $text-muted; }"

    def __init__(self, *, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self.span = 0.0

    def set_span(self, seconds: float) -> None:
        if seconds != self.span:
            self.span = seconds
            self.refresh()

    def render(self) -> Text:
        return Text(axis_text(self.span, self.size.width))
