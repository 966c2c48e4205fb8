"""Line-API widgets that hand their ready strips straight to the compositor.

Textual sends every line a widget paints through its styling pass (``StylesCache``: border,
padding, outline, tint, opacity, then the app's line filters, e.g. ANSI colours to the
theme's truecolour) and makes two or three new strips per line on the way. The GPU panel and
the process table draw none of those things: their lines are already the width of the widget
and styled. Measured on the tour at 160x50, that pass was about a third of the compositor's
time per frame (~40 changed lines a tick). These widgets resolve their styles through the
line filters once, when the style map is made, and return their cached strips as they are.

A widget given a border, padding, outline, tint, opacity or hatch (by CSS) takes Textual's
own path again, so nothing drawn differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Spacing
from textual.strip import Strip

if TYPE_CHECKING:
    from textual.widget import Widget

    _Base = Widget
else:
    # A mixin, not a Widget subclass: a Widget base ahead of ScrollView in the MRO would
    # bring Widget's default CSS in ahead of ScrollView's (overflow: hidden, no scrollbar).
    _Base = object

_NO_SPACING = Spacing(0, 0, 0, 0)


class DirectLines(_Base):
    """Mixed into a line-API widget (before its Textual base), whose ``render_line``
    returns strips styled with ``filtered`` styles, as wide as its content; with
    ``PADS_ITSELF``, as wide as its content and its left and right padding, drawn by the
    widget (``direct_padding``)."""

    PADS_ITSELF = False
    _direct: bool | None = None
    _drawing_width: int | None = None  # the content's width while render_lines runs

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._direct = None

    def filtered(self, style: Style) -> Style:
        """``style`` as the app's line filters turn it (per segment, so once per style)."""
        filters = self.get_line_filters()
        if not filters:
            return style
        strip = Strip([Segment("x", style)])
        background = self.background_colors[1]
        for line_filter in filters:
            strip = strip.apply_filter(line_filter, background)
        segment = next(iter(strip), None)
        return (segment.style or Style()) if segment is not None else style

    def _draws_itself(self) -> bool:
        if self._direct is None:
            styles = self.styles
            self._direct = bool(
                not self.BLANK
                and not any(edge for edge, _ in styles.border)
                and not any(edge for edge, _ in styles.outline)
                and (styles.padding == _NO_SPACING or (
                    self.PADS_ITSELF and not styles.padding.top and not styles.padding.bottom))
                and not styles.tint.a
                and styles.opacity == 1.0
                and styles.text_opacity == 1.0
                and not (styles.has_rule("hatch") and styles.hatch != "none")
            )
            if not self._direct:
                self._styles_cache.clear()  # lines it kept from before are stale
        return self._direct

    def direct_padding(self) -> tuple[int, int]:
        """The left and right padding a PADS_ITSELF widget draws in its lines now."""
        if not self._draws_itself():
            return 0, 0  # Textual's pass adds it
        padding = self.styles.padding
        return padding.left, padding.right

    def line_width(self) -> int:
        """The width of the lines ``render_line`` draws: the content's, scrollbars aside
        (looked up once per render: the geometry is a walk to the screen each time)."""
        if self._drawing_width is not None:
            return self._drawing_width
        return self.scrollable_content_region.width or self.size.width

    def render_lines(self, crop: Region) -> list[Strip]:
        # Textual keeps the regions passed to refresh() until Widget.render_line renders
        # them; these widgets render their own lines, so the set only grew: the GPU panel's
        # changed spans, ~14 new regions a tick, without end (Textual 8).
        self._dirty_regions.clear()
        if not self._draws_itself():
            return super().render_lines(crop)
        # As wide as the content (and padding), as the styling pass leaves them: a
        # scrollbar's gutter beside it is the scrollbar's to draw.
        region = self.region
        width = region.width
        left, right = self.direct_padding()
        inner = self.scrollable_content_region.width or width - left - right
        content = inner + left + right
        self._drawing_width = inner
        try:
            strips = [self.render_line(y) for y in crop.line_range]
        finally:
            self._drawing_width = None
        if any(strip.cell_length != content for strip in strips):
            base = self.filtered(self.rich_style)
            strips = [strip.adjust_cell_length(content, base) for strip in strips]
        x1, x2 = crop.column_span
        if (x1, x2) != (0, width):
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips
