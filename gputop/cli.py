"""Command-line entry point: ``gputop [global options] [command] ...``.

Each command lives in ``gputop/commands/<name>.py`` with ``register(subparsers, common)`` and
``run(args) -> int``; this module only parses arguments, validates the global options and
turns expected failures (``UsageError``) into one-line errors.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import textwrap

from gputop import __version__
from gputop.core.errors import UsageError

# Order is the order shown in --help.
COMMANDS = ("top", "snapshot", "watch", "capture", "memory", "stacks", "hang", "analyze", "run",
            "record", "report", "replay", "stream", "exporter")


def _add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Global options, accepted before the command and (for convenience) after it too."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--demo",
        metavar="SCENARIO",
        default=default,
        help="run on simulated GPUs with a scripted scenario (`--demo list` lists them)",
    )
    parser.add_argument(
        "--gpus",
        metavar="LIST",
        default=default,
        help="only these GPU indices, e.g. 0,2",
    )
    parser.add_argument(
        "--interval",
        metavar="SECONDS",
        type=float,
        default=argparse.SUPPRESS if suppress else 1.0,
        help="sampling interval in seconds (default 1.0)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=argparse.SUPPRESS if suppress else 0,
        help="seed of the simulated GPUs (default 0)",
    )
    from gputop.fleet.options import add_options as add_fleet_options

    add_fleet_options(parser, suppress)  # --hosts and the like: many nodes over ssh
    from gputop.fleet.prometheus.options import add_options as add_prom_options

    add_prom_options(parser, suppress)  # --prometheus URL: the fleet from a Prometheus server


def _command_globals() -> tuple[argparse.ArgumentParser, str]:
    """The global options as every command's parent (accepted after the command too), and
    the one paragraph that names them in the command's --help: their help is `gputop --help`'s,
    so a command's own options are not lost among ten of them."""
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, suppress=True)
    for action in common._actions:
        action.help = argparse.SUPPRESS  # out of the command's usage line and options
    names = [action.option_strings[-1] for action in common._actions]
    return common, (f"{', '.join(names[:-1])} and {names[-1]} go before the command (or "
                    "after it); `gputop --help` says what they do.")


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its --help ends with the global options, named once."""

    globals_note = ""

    def format_help(self) -> str:
        # As wide as argparse's own text; never split inside an option's name (--ssh-option).
        width = max(40, shutil.get_terminal_size().columns - 2)
        note = textwrap.fill(self.globals_note, width, initial_indent="  ",
                             subsequent_indent="  ", break_on_hyphens=False)
        return super().format_help().rstrip("\n") + f"\n\nglobal options:\n{note}\n"


class _NeedsEveryCommand(Exception):
    """The parser made for the live monitor alone met something it does not know."""


class _MonitorOnlyParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise _NeedsEveryCommand(message)


class _MonitorOnlyCommandParser(_CommandParser, _MonitorOnlyParser):
    pass


def _monitor_only(argv: list[str]) -> bool:
    """A command line for the live monitor (no command named, no help asked for): its
    parser needs only the `top` command, not every command's module (~25 ms at start-up)."""
    words = set(argv)
    return not (words & set(COMMANDS) or words & {"-h", "--help", "--version"})


def build_parser(commands: tuple[str, ...] = COMMANDS,
                 parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
                 command_class: type[_CommandParser] = _CommandParser
                 ) -> argparse.ArgumentParser:
    parser = parser_class(
        prog="gputop",
        description=(
            "GPU monitor for ML training: live GPUs, host and training processes, stall "
            "diagnosis, and one-key torch.profiler captures. With no command, opens the live "
            "monitor. On a machine without an NVIDIA driver, try `gputop --demo tour`."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gputop {__version__}")
    _add_global_options(parser, suppress=False)
    common, command_class.globals_note = _command_globals()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=command_class)
    for name in commands:
        module = importlib.import_module(f"gputop.commands.{name}")
        module.register(sub, common)
    return parser


def _validate_globals(args: argparse.Namespace) -> None:
    from gputop.sim.scenarios import SCENARIOS

    # "fleet": simulated nodes on the fleet screen (gputop.fleet.demo), not a node's scenario.
    if args.demo is not None and args.demo not in ("list", "fleet") and args.demo not in SCENARIOS:
        raise UsageError(
            f"unknown scenario {args.demo!r}; valid scenarios: {', '.join(SCENARIOS)}"
        )
    if args.gpus is not None:
        try:
            args.gpus = [int(x) for x in str(args.gpus).split(",") if x.strip() != ""]
        except ValueError:
            raise UsageError(f"--gpus takes indices like 0,2, not {args.gpus!r}") from None
        if any(i < 0 for i in args.gpus):
            raise UsageError("--gpus indices must be 0 or more")
    if not (0.05 <= args.interval <= 3600):
        raise UsageError("--interval must be between 0.05 and 3600 seconds")


def _check_gpus_exist(args: argparse.Namespace) -> None:
    """`--gpus 99` on a node with 8 GPUs is a typo to report, not an empty screen."""
    if not args.gpus or args.demo == "list":
        return
    if args.demo is not None:
        from gputop.sim.scenarios import SCENARIOS

        count: int | None = len(SCENARIOS[args.demo].gpus)
        why = None if count else "this scenario has no GPU"
    else:
        from gputop.collect.nvml import device_count

        count, why = device_count()
    if not count:
        raise UsageError(f"--gpus: no GPU to select: {why}; without --gpus gputop shows the "
                         "host and the training processes")
    missing = sorted({i for i in args.gpus if i >= count})
    if missing:
        have = f"GPUs 0-{count - 1}" if count > 1 else ("GPU 0" if count == 1 else "no GPU")
        raise UsageError(f"--gpus: no GPU {', '.join(map(str, missing))} here; "
                         f"this machine has {have}")


def _parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    if _monitor_only(argv):
        parser = build_parser(("top",), _MonitorOnlyParser, _MonitorOnlyCommandParser)
        try:
            return parser, parser.parse_args(argv)
        except _NeedsEveryCommand:
            pass  # the full parser says what is wrong, naming every command
    parser = build_parser()
    return parser, parser.parse_args(argv)


# The live monitor's own options, accepted without naming `top` (`gputop --readonly`): moved
# after an added `top`, where its parser reads them (VALUED: those that take a value).
TOP_OPTIONS = ("--readonly", "--auto-capture", "--replay")
VALUED = ("--replay",)


def _top_options_last(argv: list[str]) -> list[str]:
    if set(argv) & set(COMMANDS) or not any(a.split("=")[0] in TOP_OPTIONS for a in argv):
        return argv
    rest: list[str] = []
    top: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.split("=")[0] in TOP_OPTIONS:
            take = 2 if word in VALUED else 1
            top += argv[i:i + take]
            i += take
        else:
            rest.append(word)
            i += 1
    return [*rest, "top", *top]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv = _top_options_last(argv)
    parser, args = _parse(argv)
    try:
        _validate_globals(args)
        if args.demo == "list":
            from gputop.sim.scenarios import describe_scenarios

            print(describe_scenarios())
            print("fleet          the fleet screen: 4 simulated nodes (healthy, throttled, "
                  "memory-leak, host-sync), run here without ssh")
            return 0
        name = args.command or "top"
        if args.command is None:
            # Parse again so `gputop` alone gets the `top` command's defaults.
            args = parser.parse_args([*argv, "top"])
            _validate_globals(args)
        from gputop.fleet import options as fleet_options

        fleet_options.check_command(args, name)
        from gputop.fleet.prometheus.options import check_command, prometheus_requested

        check_command(args, name)
        if not (fleet_options.requested(args) or prometheus_requested(args)):  # with --hosts, --gpus is the nodes' business
            _check_gpus_exist(args)
        module = importlib.import_module(f"gputop.commands.{name}")
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left (`| head`) is seen here
        return code
    except UsageError as exc:
        from gputop.core.format import (
            safe_text,  # a message can quote a file's or a library's bytes
        )

        lines = str(exc).split("\n")  # a deliberate second line stays a line; the rest escaped
        print("\n".join(safe_text(line) for line in [f"gputop: error: {lines[0]}", *lines[1:]]),
              file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gputop snapshot | head`: the reader went away; that is not an error of ours. Point
        # stdout at /dev/null so the interpreter's own flush at exit does not complain.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
