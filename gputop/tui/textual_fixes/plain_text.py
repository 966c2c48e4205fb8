"""NO_COLOR done whole: a line filter for every App of the interface."""

from __future__ import annotations

from rich.segment import Segment
from textual.filter import LineFilter


class PlainText(LineFilter):
    """NO_COLOR: drop every style, not just the colours. Textual's own filter keeps grey
    tones, and any attribute (bold, reverse) makes terminals emit colour resets too."""

    def apply(self, segments: list[Segment], background) -> list[Segment]:
        return [Segment(text, None, control) for text, _, control in segments]
