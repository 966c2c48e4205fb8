"""Strips the screen drops are freed at once: Textual's divide and crop_extend cache their
result in the strip, the strip itself included, which made every line a widget spans whole a
reference cycle (gputop.tui.textual_fixes.strip_cycles)."""

from __future__ import annotations

import gc

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

import gputop.tui.textual_fixes.strip_cycles as strip_cycles

RED = Style(color="red")


def strip() -> Strip:
    return Strip([Segment("util ", RED), Segment("98%", None), Segment("  ", RED)])


def cycles_left_by(call) -> int:
    """Objects the collector has to free after ``call`` made a strip and dropped it."""
    gc.collect()
    gc.disable()
    try:
        call(strip())
        return gc.collect()
    finally:
        gc.enable()


CALLS = {
    "divide at its end": lambda s: s.divide([s.cell_length]),
    "cropped and extended to its own span": lambda s: s.crop_extend(0, s.cell_length, RED),
}


def test_textuals_own_methods_leave_a_cycle_and_the_installed_ones_none():
    strip_cycles.install()
    try:
        Strip.divide = strip_cycles._textual_divide
        Strip.crop_extend = strip_cycles._textual_crop_extend
        assert all(cycles_left_by(call) > 0 for call in CALLS.values())
    finally:
        strip_cycles.install()
    assert {name: cycles_left_by(call) for name, call in CALLS.items()} == dict.fromkeys(CALLS, 0)


def test_every_result_is_textuals():
    strip_cycles.install()
    s = strip()
    assert s.divide([10]) == [s] and s.crop_extend(0, 10, RED) is s
    for cuts in ([4], [4, 10], [3, 7, 10], [12]):
        assert list(s.divide(cuts)) == list(strip_cycles._textual_divide(strip(), cuts))
    for start, end in ((0, 4), (2, 10), (0, 14), (3, 12)):
        assert s.crop_extend(start, end, RED) == strip_cycles._textual_crop_extend(
            strip(), start, end, RED)
    assert s.crop_extend(3, 12, RED).cell_length == 9
