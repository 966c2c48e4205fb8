"""One rank's Python stack at the moment of a hang, as the attribution reads it.

The live side fills it (py-spy over each local rank, or the agent's own stack dump); the
offline side fills it from a dump's entry frames when nothing better is known. Pure data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Paths of installed code: a rank's "where" is its innermost frame outside these (the same rule
# as gputop/stacks/profile.py, kept here so this package stays free of the stacks package).
_LIBRARY = re.compile(r"(^|/)(site-packages|dist-packages|lib/python\d[\d.]*|lib64/python\d[\d.]*)"
                      r"/|^<frozen |^<built-in>$|(^|/)torch/")
MAX_FRAMES = 64  # frames kept of one stack, innermost first


@dataclass(frozen=True)
class StackFrame:
    function: str
    file: str
    line: int | None = None

    @property
    def is_library(self) -> bool:
        return bool(_LIBRARY.search(self.file))

    def short(self) -> str:
        """``train.py:57 time.sleep`` style: the file's base name, line and function."""
        base = self.file.rsplit("/", 1)[-1] or self.file
        at = f"{base}:{self.line}" if self.line is not None else base
        return f"{at} {self.function}"


@dataclass(frozen=True)
class RankStack:
    """Where one rank is. ``frames`` are innermost first (as py-spy's ``dump --json`` gives
    them). ``holds_gil`` is py-spy's view (None when unknown): a rank that holds the GIL cannot
    answer its agent, so only py-spy can read it. ``where`` overrides the line derived from the
    frames (e.g. "train.py:57 time.sleep" already computed by the live side)."""

    rank: int
    pid: int | None = None
    frames: tuple[StackFrame, ...] = field(default_factory=tuple)
    holds_gil: bool | None = None
    thread: str | None = None
    where: str | None = None
    error: str | None = None  # why no stack could be read (one line), when none was

    def user_frame(self) -> StackFrame | None:
        """The innermost frame in the user's code (outside installed libraries and torch)."""
        for f in self.frames[:MAX_FRAMES]:
            if not f.is_library:
                return f
        return None

    def where_line(self) -> str | None:
        """"train.py:57 time.sleep": the user's line, and the call it makes there (the frame
        just inside it, e.g. the library function it waits in), when both are known."""
        if self.where:
            return self.where
        frames = self.frames[:MAX_FRAMES]
        for i, f in enumerate(frames):
            if f.is_library:
                continue
            base = f.file.rsplit("/", 1)[-1] or f.file
            at = f"{base}:{f.line}" if f.line is not None else base
            inner = frames[i - 1].function if i > 0 else f.function
            return f"{at} {inner}"
        return frames[0].short() if frames else None
