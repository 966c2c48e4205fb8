"""Which process this is: a multiprocessing child, a DataLoader worker. Stdlib only, cheap:
``gputop.agent`` asks before it loads anything else."""

from __future__ import annotations

import sys


def is_multiprocessing_child() -> bool:
    """A process started by multiprocessing (spawn, forkserver) or a fork of one."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    if "--multiprocessing-fork" in argv:
        return True
    # multiprocessing's helpers: the resource tracker and the forkserver.
    if "-c" in argv[:-1] and argv[argv.index("-c") + 1].startswith("from multiprocessing."):
        return True
    mp = sys.modules.get("multiprocessing")
    try:
        return mp is not None and mp.parent_process() is not None
    except Exception:
        return False


def in_dataloader_worker() -> bool:
    if "torch" not in sys.modules:
        return False
    try:
        from torch.utils.data import get_worker_info

        return get_worker_info() is not None
    except Exception:
        return False
