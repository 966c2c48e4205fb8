"""Small, pure text formatters shared by the CLI reports and the TUI."""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3


def bytes_h(value: float | None, unit: str | None = None) -> str:
    """1536 -> '1.5K'; ``unit`` forces 'G' or 'M'."""
    if value is None:
        return "n/a"
    if unit == "G" or (unit is None and value >= GIB):
        return f"{value / GIB:.1f}G"
    if unit == "M" or (unit is None and value >= MIB):
        return f"{value / MIB:.0f}M"
    if value >= KIB:
        return f"{value / KIB:.0f}K"
    return f"{value:.0f}B"


def pct(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}%"


def num(value: float | None, digits: int = 0, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def rate_h(bps: float | None) -> str:
    """Bytes per second, short."""
    if bps is None:
        return "n/a"
    return bytes_h(bps) + "/s"


def mbs_h(mbs: float | None) -> str:
    """MB/s from NVML PCIe counters, short: 950M, 21.3G."""
    if mbs is None:
        return "n/a"
    return f"{mbs / 1000:.1f}G" if mbs >= 1000 else f"{mbs:.0f}M"


def ms_h(x_ms: float) -> str:
    """A duration given in milliseconds, in the unit that reads best (s, ms, us)."""
    if x_ms >= 10_000:
        return f"{x_ms / 1e3:.1f} s"
    if x_ms >= 100:
        return f"{x_ms:.0f} ms"
    if x_ms >= 1:
        return f"{x_ms:.1f} ms"
    return f"{x_ms * 1e3:.0f} us"


def safe_text(text: object) -> str:
    """Text from outside (a command line, an agent's message) made safe to print: control
    characters, escapes and bidi overrides become visible ``\\x..`` / ``\\u....`` codes."""
    text = str(text)
    if text.isprintable():  # every character below is in a category isprintable refuses
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif 0x202A <= code <= 0x202E or 0x2066 <= code <= 0x2069 or code in (0x200E, 0x200F):
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


# What JSON leaves raw but a terminal acts on, in UTF-8: C1 controls, DEL, the bidi marks,
# embeddings, overrides and isolates (JSON escapes only C0 controls).
RAW_IN_JSON = re.compile(rb"\x7f|\xc2[\x80-\x9f]|\xe2\x80[\x8e\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]")


def json_safe(data: bytes) -> bytes:
    """Encoded JSON (UTF-8) with those characters written as ``\\uXXXX`` escapes: the same
    JSON value, but printing it cannot reorder or restyle a terminal's text. (They can only
    stand inside strings: JSON's own syntax is ASCII.)"""
    return RAW_IN_JSON.sub(lambda m: b"\\u%04x" % ord(m.group().decode()), data)


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
