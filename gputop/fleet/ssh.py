"""How a node is reached: the user's own OpenSSH client, as a plain subprocess.

Nothing here replaces ssh's configuration: ~/.ssh/config, the agent, ProxyJump and
ControlMaster apply as they do in the user's shell. gputop only adds what a monitor needs:
no prompts (BatchMode: a password or host-key question would hang the screen), a bounded
connect time, keep-alives so a dead node is noticed, and no pseudo-terminal (the stream is
data, not a screen).
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass, field

from gputop.core.errors import UsageError

# Defaults a monitor needs; the user's -o options come after them (and so do ~/.ssh/config's
# values for anything not given here, since ssh takes the first value it sees of an option).
BASE_OPTIONS = (
    "BatchMode=yes",
    "ConnectTimeout=10",
    "ServerAliveInterval=5",
    "ServerAliveCountMax=2",
    "LogLevel=ERROR",
)


@dataclass(frozen=True)
class SshSettings:
    """What `--ssh-config`, `--ssh-option`, `--remote-gputop` and the global options give."""

    program: str = "ssh"
    config: str | None = None
    options: tuple[str, ...] = ()
    remote_gputop: str = "gputop"
    # Global options passed on to the node's gputop (--demo, --interval, --gpus, --seed).
    passthrough: tuple[str, ...] = field(default=())

    def ssh_argv(self, host: str, remote_command: str) -> list[str]:
        argv = [self.program, "-T"]
        if self.config:
            argv += ["-F", self.config]
        # The user's options first: ssh keeps the first value it is given for an option.
        for opt in (*self.options, *BASE_OPTIONS):
            argv += ["-o", opt]
        return [*argv, host, remote_command]

    def gputop_command(self, *args: str) -> str:
        """The shell command run on the node: the configured gputop (taken as the user wrote
        it: `~/venv/bin/gputop` or `module load x && gputop` work) with our arguments quoted."""
        words = [*self.passthrough, *args]
        return " ".join([self.remote_gputop, *(shlex.quote(w) for w in words)])


def settings_from_args(args: argparse.Namespace) -> SshSettings:
    options = tuple(getattr(args, "ssh_option", None) or ())
    for opt in options:
        if not opt or "=" not in opt and " " not in opt or _bad(opt):
            raise UsageError(f"--ssh-option takes an ssh option like Port=2222, not {opt[:60]!r}")
    remote = getattr(args, "remote_gputop", None) or "gputop"
    if _bad(remote) or not remote.strip():
        raise UsageError("--remote-gputop must be one line of shell command")
    config = getattr(args, "ssh_config", None)
    if config is not None:
        if not os.path.isfile(config):
            raise UsageError(f"--ssh-config: no such file: {config}")
    return SshSettings(config=config, options=options, remote_gputop=remote,
                       passthrough=tuple(passthrough_args(args)))


def passthrough_args(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if getattr(args, "demo", None):
        out += ["--demo", args.demo]
    if getattr(args, "gpus", None):
        out += ["--gpus", ",".join(str(i) for i in args.gpus)]
    interval = getattr(args, "interval", None)
    if interval is not None:
        out += ["--interval", f"{interval:g}"]
    if getattr(args, "demo", None) and getattr(args, "seed", 0):
        out += ["--seed", str(args.seed)]
    return out


def _bad(text: str) -> bool:
    return any(ch in text for ch in "\n\r\0")

