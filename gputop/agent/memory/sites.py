"""Which source line each operator of the training thread runs for, marked in the profiler's
trace while a memory capture records without CUDA.

The profiler's memory events (``profile_memory=True``) say what was allocated and freed, by
which operator, but not from which Python line; its Python tracer (``with_stack=True``) would,
at the price of an event per Python call (a Python-heavy input pipeline: millions a second,
seconds to process at stop, on the training thread). Instead a ``TorchDispatchMode`` entered on
the training thread for the captured steps runs each aten operator inside a profiler
annotation (``RecordFunctionFast``) named after the innermost user frame that called it
(``gputop.site:<n>``): its allocations are that annotation's children in the event tree. The
cost is per operator (a few microseconds: a frame walk, cached per code object, and the
annotation), not per Python call.

The mode is entered and left on the training thread only, and only when it is on top of the
thread's dispatch-mode stack (as ``flops.FlopCount`` does): another mode above it waits for
the next step boundary. Training process side: torch comes in only when the program has
imported it.
"""

from __future__ import annotations

import sys
import threading
from types import CodeType, FrameType
from typing import Any

from gputop.agent.memory.events import Site, Sites, is_library, resolve

PREFIX = "gputop.site:"
_MAX_CODES = 100_000

_codes: dict[CodeType, tuple[str, bool]] = {}  # code -> (file, in the user's own code)


def frame_site(frame: FrameType | None) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame in the user's code, from ``frame`` out."""
    while frame is not None:
        code = frame.f_code
        known = _codes.get(code)
        if known is None:
            path = resolve(code.co_filename)
            known = (path, not is_library(path))
            if len(_codes) < _MAX_CODES:
                _codes[code] = known
        if known[1]:
            return known[0], frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


def site_marks(sites: Sites) -> Any:
    """A dispatch mode that marks each operator with its user line's index in ``sites``."""
    from torch._C._profiler import _RecordFunctionFast
    from torch.utils._python_dispatch import TorchDispatchMode

    names: dict[tuple[str, int, str], str] = {}
    getframe = sys._getframe

    class SiteMarks(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.thread = threading.get_ident()
            self.active = True  # False: marks nothing, until the next boundary leaves it

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if not self.active:
                return func(*args, **(kwargs or {}))
            try:
                found = frame_site(getframe(1))
                name = None
                if found is not None:
                    name = names.get(found)
                    if name is None:
                        name = names[found] = f"{PREFIX}{sites.add(Site(*found))}"
            except Exception:  # never in the way of the operator
                name = None
            if name is None:
                return func(*args, **(kwargs or {}))
            with _RecordFunctionFast(name):
                return func(*args, **(kwargs or {}))

    return SiteMarks()


def _current_mode() -> Any:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


def enter(mode: Any) -> None:
    mode.__enter__()


def leave(mode: Any) -> bool:
    """Leave the mode: only on its thread and only when it is on top (else False)."""
    if threading.get_ident() != mode.thread or _current_mode() is not mode:
        return False
    mode.__exit__(None, None, None)
    return True


def leave_after_fork(mode: Any) -> None:
    """In a forked child (a DataLoader worker forked while recording): its thread inherited
    the mode, and nothing would ever leave it there."""
    try:
        if _current_mode() is mode:
            mode.__exit__(None, None, None)
    except Exception:
        pass
