"""The keys of the screen on one line, as Textual's Footer shows them, in one widget.

Textual's Footer is a container with a widget per key, each bound to the footer's ``compact``
setting and recomposed whenever the bindings change: at start-up its ~36 key widgets and
their style updates were a sixth of the time to the first frame, and every repaint that
reached the last line walked them all. This one draws the same line (key, then what it does,
in the footer colours of the theme) from the screen's active bindings, and a click on a key
presses it.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text

from gputop.tui.widgets.text_line import StripWidget


class KeyFooter(StripWidget):
    DEFAULT_CSS = """
    KeyFooter {
        dock: bottom;
        height: 1;
        color: $footer-foreground;
        background: $footer-background;
    }
    KeyFooter > .key-footer--key {
        color: $footer-key-foreground;
        background: $footer-key-background;
        text-style: bold;
    }
    KeyFooter > .key-footer--description {
        color: $footer-description-foreground;
        background: $footer-description-background;
    }
    KeyFooter > .key-footer--disabled { text-style: dim; }
    """
    COMPONENT_CLASSES = {"key-footer--key", "key-footer--description", "key-footer--disabled"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._spans: list[tuple[int, int, str]] = []  # (start, end, key) of each item

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self.rebuild()

    def _bindings_changed(self, _screen) -> None:
        self.rebuild()

    def on_resize(self, _event) -> None:
        self.rebuild()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self.is_mounted:
            self.rebuild()

    def items(self) -> list[tuple[str, str, str, bool]]:
        """(key, key as shown, description, enabled) of each key shown, in order: one per
        action (the first of its keys), as Textual's Footer lists them."""
        seen: set[str] = set()
        out = []
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            out.append((binding.key, self.app.get_key_display(binding), binding.description,
                        enabled))
        return out

    def rebuild(self) -> None:
        if not self.is_mounted:
            return
        key_style = self.get_component_rich_style("key-footer--key", partial=True)
        description_style = self.get_component_rich_style("key-footer--description",
                                                          partial=True)
        dim = self.get_component_rich_style("key-footer--disabled", partial=True)
        text = Text()
        spans = []
        width = self.size.width or 10_000
        for key, shown, description, enabled in self.items():
            # Whole keys or none: a key cut at the edge ("Memor") reads as a typo.
            if text.cell_len + cell_len(f" {shown} {description}") > width:
                break
            start = text.cell_len
            text.append(f" {shown} ", key_style if enabled else key_style + dim)
            if description:
                text.append(f"{description} ",
                            description_style if enabled else description_style + dim)
            spans.append((start, text.cell_len, key))
        self._spans = spans
        self.show_text(text)

    def on_click(self, event) -> None:
        for start, end, key in self._spans:
            if start <= event.x < end:
                self.app.simulate_key(key)
                return
