"""The fleet's command-line options and whether they ask for the fleet, without what runs
it: the monitor parses and checks these on every start, and loads the ssh transport, the
demo fleet and the fleet screen only when they are given."""

from __future__ import annotations

import argparse

from gputop.core.errors import UsageError

DEMO_SCENARIO = "fleet"  # `--demo fleet`: simulated nodes (gputop.fleet.demo)
FLEET_COMMANDS = ("top", "watch")


def add_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The fleet's options, global like --demo (accepted before or after the command)."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--hosts", metavar="A,B,C", default=default,
                        help="monitor these nodes over ssh (the live monitor and `watch`)")
    parser.add_argument("--hostfile", metavar="FILE", default=default,
                        help="monitor the nodes listed in FILE (one per line, # comments)")
    parser.add_argument("--slurm", metavar="JOBID", default=default,
                        help="monitor the nodes of a Slurm job (`scontrol show hostnames`)")
    parser.add_argument("--ssh-config", metavar="FILE", default=default,
                        help="ssh configuration file for the nodes (ssh -F; default: ssh's own, "
                             "~/.ssh/config)")
    parser.add_argument("--ssh-option", metavar="OPTION", action="append",
                        default=argparse.SUPPRESS if suppress else [],
                        help="an ssh -o option for the nodes, e.g. --ssh-option Port=2222 "
                             "(repeat for several)")
    parser.add_argument("--remote-gputop", metavar="CMD", default=default,
                        help="how to run gputop on the nodes, for their shell (default: gputop; "
                             "e.g. ~/venv/bin/gputop)")


def requested(args: argparse.Namespace) -> bool:
    """--hosts, --hostfile, --slurm or --demo fleet."""
    return getattr(args, "demo", None) == DEMO_SCENARIO or any(
        getattr(args, name, None) is not None for name in ("hosts", "hostfile", "slurm"))


def check_command(args: argparse.Namespace, command: str) -> None:
    if requested(args) and command not in FLEET_COMMANDS:
        raise UsageError(f"--hosts, --hostfile, --slurm and --demo fleet go with the live "
                         f"monitor and `watch`, not `{command}`")
