"""`gputop analyze`: not built yet."""

from __future__ import annotations

import argparse

from gputop.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    sub.add_parser("analyze", parents=[common], help="(not built yet)")


def run(args: argparse.Namespace) -> int:
    raise UsageError("`gputop analyze` is not built yet")
