"""One checker for numbers that come from outside: agents, recordings, node streams, requests.

Stdlib only, no gputop imports: both sides of the agent's socket and every reader use it. A
number is a real ``int`` or ``float`` (never a ``bool``), finite, inside the range its meaning
allows; anything else is ``None``, and the caller drops it (and counts it, where it reports).
"""

from __future__ import annotations

import math
from typing import Any

# Ranges by meaning: what a value of that kind can be on any machine, with room to spare.
RATIO = (0.0, 1.0)  # a share of time: 0-1
COUNT = (0, 2**63 - 1)  # a counter: non-negative
RATE = (0.0, 1e6)  # steps per second: a million steps/s is beyond any training loop
SECONDS = (1e-9, 1e9)  # a duration that happened: positive and finite (31 years)
AGE = (0.0, 1e9)  # an age may be zero
# FLOP/s one device can do: an H200's dense fp8 peak is ~2e15; a figure above this is a lie.
MAX_DEVICE_FLOPS = 1e18
PEAK_MARGIN = 1.2  # achieved FLOP/s over the datasheet peak by more than this: not believed


def number(value: Any, low: float = -math.inf, high: float = math.inf,
           integer: bool = False, parse: bool = False) -> float | int | None:
    """``value`` as a finite number in ``[low, high]``, else None. ``integer``: an int (a float
    with no fraction is accepted); ``parse``: text and numpy scalars are converted first."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, (int, float)):
        if not parse:
            return None
        try:
            value = float(value)
        except (TypeError, ValueError, OverflowError):
            return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if integer:
            if not value.is_integer():
                return None
            value = int(value)
    elif not integer:
        value = float(value)
    checked: float | int = value
    if not low <= checked <= high:
        return None
    return checked


def is_number(value: Any) -> bool:
    """A real, finite number (no bool)."""
    return number(value) is not None


def ratio(value: Any) -> float | None:
    return number(value, *RATIO)


def count(value: Any) -> int | None:
    found = number(value, *COUNT, integer=True)
    return None if found is None else int(found)


def seconds(value: Any) -> float | None:
    return number(value, *SECONDS)


def json_depth(data: bytes | str, limit: int) -> bool:
    """True when the JSON text nests no deeper than ``limit`` (arrays and objects), checked
    without parsing it (a parser recurses: 100,000 ``[`` raise RecursionError). Brackets inside
    strings are not counted."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    depth = 0
    in_string = escaped = False
    # A bytes scan in Python is ~50 ns a byte: callers bound the size first (1 MiB: ~50 ms).
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def real(value: Any, low: float = -math.inf, high: float = math.inf) -> float | None:
    """``number`` as a float (a counter's int too): for figures computed with."""
    found = number(value, low, high)
    return None if found is None else float(found)
