"""Your own processes on the demo's simulated GPUs: ``GPUTOP_DEMO_PIDS=0:4242,1:4243``.

The simulated driver reports whatever real pids it is told; normally those of the demo's
stand-ins. With this variable, the GPUs it names report the given processes instead (and get
no stand-in), so a real job on a machine without a GPU (a CPU training run, a test) can be
watched, diagnosed and sampled (`p`, `gputop stacks`) as if it ran on that GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gputop.core.errors import UsageError

ENV = "GPUTOP_DEMO_PIDS"


def attached_pids(gpu_count: int, environ: Mapping[str, str] | None = None
                  ) -> dict[int, list[int]]:
    """{GPU index: [pid, ...]} from $GPUTOP_DEMO_PIDS (``GPU:PID`` items, comma-separated);
    a malformed value is a UsageError (one line)."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    out: dict[int, list[int]] = {}
    if not text:
        return out
    if gpu_count == 0:
        raise UsageError(f"{ENV}: this scenario has no GPU to put processes on")
    for item in text.split(","):
        gpu, sep, pid = item.strip().partition(":")
        try:
            index, number = int(gpu), int(pid)
        except ValueError:
            index = number = -1
        if not sep or number <= 0 or not 0 <= index < gpu_count:
            raise UsageError(f"{ENV}: {item.strip()!r} is not GPU:PID with a GPU of the "
                             f"scenario (0-{gpu_count - 1}) and a process id")
        out.setdefault(index, []).append(number)
    return out
