"""Bounded memory for the process-wide caches that drawing fills with values seen once.

rich keeps the cell width of every short string it measures (``cached_cell_len``, 4096
strings) and Textual the results of ``Region``'s geometry methods (``translate``: 1024,
``intersection``: 4096, ...). A monitor's lines hold figures that change every tick
("43.2 %", "71.9 GiB"), so those caches fill with strings and regions drawn once: on the tour,
~40 new strings a second, 2400 after the first minute, ~0.5 MiB with their strings, then
4096 for as long as the monitor runs; the Region caches ~0.35 MiB more.

``clear`` empties them; the app calls it every ``EVERY_FRAMES`` frames. What a frame needs
again is measured again on its next paint (a set lookup per string for plain text), so the
caches still serve the frames between two clears, and hold at most those frames' values.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.cells import cached_cell_len
from textual.geometry import Region

EVERY_FRAMES = 5


def _region_caches() -> tuple[Callable[[], None], ...]:
    """The ``cache_clear`` of each of Region's cached methods (whichever Textual caches)."""
    return tuple(member.cache_clear for member in vars(Region).values()
                 if callable(getattr(member, "cache_clear", None)))


_CLEARS = (cached_cell_len.cache_clear, *_region_caches())


def clear() -> None:
    for clear_one in _CLEARS:
        clear_one()
