"""Textual's strips without references to themselves.

Textual (8.x) caches what two ``Strip`` methods return in the strip itself, also when that is
the strip: ``divide`` with one cut at its end (the compositor's call for every line a widget
spans whole) and ``crop_extend`` to its own span. Each such strip is a reference cycle: once
its widget drops it, it waits for the garbage collector's middle generation (every ~50 s at
the thresholds ``freeze_startup_objects`` sets) with its segments and seven caches. On the tour
that was ~12 000 objects at a time, and the monitor's RSS 2.1 MiB higher at 60 s and 2.7 MiB
at 180 s.

``install`` wraps the two methods so that they return the strip itself without caching
it; every other result is Textual's own, cached as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.style import Style
from textual.strip import Strip

_textual_divide = Strip.divide
_textual_crop_extend = Strip.crop_extend


def _divide(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
    cuts = list(cuts)
    length = self.cell_length
    if [cut for cut in cuts if cut <= length] == [length]:
        return [self]
    return _textual_divide(self, cuts)


def _crop_extend(self: Strip, start: int, end: int, style: Style | None) -> Strip:
    if start == 0 and end == self.cell_length:
        return self
    return _textual_crop_extend(self, start, end, style)


def install() -> None:
    """Wrap the two methods (the interface's modules call this on import)."""
    Strip.divide = _divide  # type: ignore[method-assign,assignment]
    Strip.crop_extend = _crop_extend  # type: ignore[method-assign]
