"""`gputop top` (and `gputop` alone): the live monitor."""

from __future__ import annotations

import argparse
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
        return 1
    return int(code or 0)
