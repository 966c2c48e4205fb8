"""`gputop top` (and `gputop` alone): the live monitor."""

from __future__ import annotations

import argparse
import os
import sys

from gputop.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    sub.add_parser(
        "top",
        parents=[common],
        help="the live monitor (the default command)",
        description="Live GPUs, host and training processes with their DataLoader workers. "
        "Keys: q quit, space pause, 1-4 chart window, c compact, s/S sort, / filter, t tree, "
        "Enter process view, k signal (asks first), p capture, ? help. Respects NO_COLOR.",
    )


def run(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(
            "the live monitor needs a terminal; for text output use `gputop snapshot`"
        )
    from gputop.tui.app import GputopApp

    app = GputopApp(demo=args.demo, gpus=args.gpus, interval=args.interval, seed=args.seed)
    code = app.run()
    if app.error:
        print(f"gputop: error: the sampler stopped: {app.error}", file=sys.stderr)
        code = 1
    # Everything is cleaned up by now: Textual restored the terminal, and the sampler thread
    # (joined when the app's event loop closed) stopped the demo processes. Tearing down an
    # interpreter that holds Textual and pandas costs a noticeable fraction of a second after
    # q; leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))
