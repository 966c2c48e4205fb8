"""`gputop --demo fleet`: the fleet screen on simulated nodes, without ssh.

Each "node" is a local `gputop --demo SCENARIO stream` started directly (no ssh, no sshd),
with a scenario of its own, so a newcomer sees what `gputop --hosts a,b,c` shows: several
nodes, their GPUs and findings side by side. Everything else (the screen, `watch --hosts`'s
lines, a node that ends) is the real fleet code: only the transport is local.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass

import gputop
from gputop.fleet.options import DEMO_SCENARIO
from gputop.fleet.ssh import SshSettings

SCENARIO = DEMO_SCENARIO
# node name -> the scenario it simulates: different problems, light stand-ins (no torch).
NODES = {
    "node01": "healthy",
    "node02": "throttled",
    "node03": "memory-leak",
    "node04": "host-sync",
}
_GPUTOP = "__gputop__"  # stands for the node's gputop in the command the fleet builds
# The nodes run `python -m gputop` from "/", with this gputop's folder first on the path (as the
# demo's stand-ins do): in the folder `git clone` leaves you in, the checkout's gputop/ would
# otherwise be imported as a bare namespace instead of the installed package.
NEUTRAL_CWD = "/"
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gputop.__file__)))


@dataclass(frozen=True)
class LocalNodes(SshSettings):
    """SshSettings whose "ssh" runs the node's gputop here, with the node's scenario."""

    remote_gputop: str = _GPUTOP

    def ssh_argv(self, host: str, remote_command: str) -> list[str]:
        scenario = NODES.get(host, "healthy")
        path = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
        gputop = " ".join(shlex.quote(w) for w in
                          ("env", f"PYTHONPATH={path}", sys.executable, "-m", "gputop",
                           "--demo", scenario))
        return ["sh", "-c", f"cd {shlex.quote(NEUTRAL_CWD)} && exec "
                + remote_command.replace(_GPUTOP, gputop, 1)]


def targets_and_settings(args) -> tuple[list[str], SshSettings]:
    """The simulated nodes and their local transport; --interval and --seed go to each."""
    passthrough: list[str] = []
    interval = getattr(args, "interval", None)
    if interval is not None:
        passthrough += ["--interval", f"{interval:g}"]
    if getattr(args, "seed", 0):
        passthrough += ["--seed", str(args.seed)]
    return list(NODES), LocalNodes(passthrough=tuple(passthrough))


def fleet_from_args(args) -> tuple[list[str], SshSettings]:
    """The nodes named by --hosts/--hostfile/--slurm and how to reach them, or, for
    `--demo fleet`, the simulated nodes run here (no ssh)."""
    if getattr(args, "demo", None) == SCENARIO:
        return targets_and_settings(args)
    from gputop.fleet.ssh import settings_from_args
    from gputop.fleet.targets import resolve_targets

    hosts = resolve_targets(getattr(args, "hosts", None), getattr(args, "hostfile", None),
                            getattr(args, "slurm", None))
    return hosts, settings_from_args(args)
