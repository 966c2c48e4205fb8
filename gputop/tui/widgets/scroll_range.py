"""A scrolling widget's virtual size set without laying the screen out again.

Textual lays the whole screen out for any new ``virtual_size`` (its reactive is declared
``layout=True``): ~5 ms of CPU at 160x50. The findings panel's text rewraps as its numbers move
and the process table's rows come and go, so on the tour that was a layout every ~3 s, about a
tenth of the monitor's CPU. Where only the scroll range changes, nothing on screen
moves but the scrollbar's thumb: the size is set quietly and the scrollbar repainted.
"""

from __future__ import annotations

from textual.geometry import Size
from textual.widget import Widget


def set_virtual_size(widget: Widget, size: Size) -> None:
    """``widget.virtual_size = size``; without a layout when the width stays, the vertical
    scrollbar stays shown or hidden (``overflow-y: auto``) and the scroll position stays in
    range. Anything else takes Textual's own path (a layout)."""
    old = widget.virtual_size
    if size == old:
        return
    view = widget.container_size
    quiet = (
        widget.is_mounted
        and bool(view)
        and size.width == old.width
        and widget.styles.overflow_y == "auto"
        and widget.styles.overflow_x == "hidden"
        and (size.height > view.height) == widget.show_vertical_scrollbar
        and widget.scroll_offset.y <= max(0, size.height - view.height)
    )
    if not quiet:
        widget.virtual_size = size
        return
    widget.set_reactive(Widget.virtual_size, size)
    if widget.show_vertical_scrollbar:
        widget.vertical_scrollbar.window_virtual_size = size.height
    widget.refresh()
