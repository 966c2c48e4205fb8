"""Widgets that draw given text through Textual's line API, repainting only on a change.

Static.update() asks for a new layout on every call and renders through Textual's general
content pipeline; these widgets have a fixed size, keep their lines as ready strips and skip
the repaint when a tick brings the same text, which keeps a frame cheap (see
benchmarks/bench_tui.py).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget

from gputop.tui.widgets.direct_lines import DirectLines


def text_strips(widget: Widget, text: Text, width: int, left: int = 0,
                right: int = 0) -> list[Strip]:
    """``text`` as one strip per line, cut or padded to ``width``, on the widget's style,
    with ``left`` and ``right`` cells of padding, through the app's line filters."""
    base = widget.rich_style
    segments = list(text.render(widget.app.console))
    base_background, background = widget.background_colors
    # The padding as Textual's styling pass draws it: the background alone.
    pad = TextualStyle(background=base_background + background).rich_style
    strips = []
    for line in Segment.split_lines(segments):
        strip = Strip(line).apply_style(base).adjust_cell_length(width, base)
        if left or right:
            strip = Strip.join([Strip.blank(left, pad), strip, Strip.blank(right, pad)])
        strips.append(strip)
    for line_filter in widget.get_line_filters():
        strips = [strip.apply_filter(line_filter, background) for strip in strips]
    return strips


class StripWidget(DirectLines, Widget):
    """Shows a Text given with ``show_text``; widgets whose text depends on their width
    rebuild it in ``rebuild`` (called on resize)."""

    PADS_ITSELF = True

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._text = Text()
        self._strips: list[Strip] | None = None
        self._strips_key: tuple | None = None

    def rebuild(self) -> None:
        """Make the text again for a new width (widgets whose text depends on it)."""

    def on_resize(self) -> None:
        self.rebuild()

    def show_text(self, text: Text) -> None:
        """Repaint only when the text differs from what is on screen."""
        if text == self._text:
            return
        grew = text.plain.count("\n") != self._text.plain.count("\n")
        self._text = text
        self._strips = None
        # A different number of lines matters only to auto-height widgets: then re-layout.
        self.refresh(layout=grew)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = None

    def render_line(self, y: int) -> Strip:
        width = self.line_width()
        left, right = self.direct_padding()
        key = (width, left, right)  # a new style clears the strips (notify_style_update)
        if self._strips is None or self._strips_key != key:
            self._strips = text_strips(self, self._text, width, left, right)
            self._strips_key = key
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width + left + right, self.filtered(self.rich_style))

    def get_content_height(self, container, viewport, width: int) -> int:
        return self._text.plain.count("\n") + 1

    def get_content_width(self, container, viewport) -> int:
        return max((cell_len(line) for line in self._text.plain.split("\n")), default=0)


class TextLine(StripWidget):
    DEFAULT_CSS = """
    TextLine { height: 1; }
    """

    def __init__(self, text: Text | str = "", *, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._text = Text(text) if isinstance(text, str) else text

    @property
    def text(self) -> Text:
        return self._text

    def set_text(self, text: Text | str) -> None:
        self.show_text(Text(text) if isinstance(text, str) else text)


class WrappedText(StripWidget):
    """A text folded onto the lines its width needs, at most ``max_lines`` (the last ends
    with an ellipsis when more would be needed): a whole command line, say."""

    DEFAULT_CSS = """
    WrappedText { height: auto; }
    """

    def __init__(self, max_lines: int = 4, *, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.max_lines = max_lines
        self._source = Text()

    def set_text(self, text: Text) -> None:
        if text != self._source:
            self._source = text
            self.rebuild()

    def rebuild(self) -> None:
        left, right = self.direct_padding() if self.is_mounted else (0, 0)
        width = max(10, (self.size.width or self.app.size.width) - left - right)
        lines = list(self._source.wrap(self.app.console, width, overflow="fold"))
        if len(lines) > self.max_lines:
            lines = lines[:self.max_lines]
            last = lines[-1]
            last.truncate(width - 1)
            last.append("…")
        self.show_text(Text("\n").join(lines))
