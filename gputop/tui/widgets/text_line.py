"""A widget that shows a given Text and repaints only when it changes.

Static.update() asks for a new layout on every call; these lines have a fixed size, so a repaint
is enough and per-tick updates stay cheap.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class TextLine(Widget):
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
        text = Text(text) if isinstance(text, str) else text
        if text == self._text:
            return
        # A different number of lines matters only to auto-height lines: then re-layout.
        grew = text.plain.count("\n") != self._text.plain.count("\n")
        self._text = text
        self.refresh(layout=grew)

    def render(self) -> Text:
        return self._text
