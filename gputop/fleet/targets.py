"""Which nodes: `--hosts a,b,c`, `--hostfile FILE` or `--slurm JOBID` (`scontrol show
hostnames`). Names are what the user gives ssh (an alias of ~/.ssh/config, user@host, an
address); they are checked so that none can be read by ssh as an option."""

from __future__ import annotations

import re
import subprocess

from gputop.core.errors import UsageError

MAX_HOSTS = 1024
# What ssh accepts as a destination, without spaces, quotes or a leading dash: names,
# addresses (IPv6 too), user@host, and %-escaped scopes.
_HOST = re.compile(r"^[A-Za-z0-9_.@%:+\[\]][A-Za-z0-9_.@%:+\[\]-]{0,254}$")
_JOBID = re.compile(r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?$")


def check_host(name: str) -> str:
    if not _HOST.match(name):
        raise UsageError(f"not a host name: {name[:80]!r} (names, addresses and user@host; "
                         "no spaces, no leading '-')")
    return name


def parse_hosts(text: str) -> list[str]:
    """'a,b, c' -> ['a', 'b', 'c']; duplicates keep their first place."""
    return _unique([check_host(part.strip()) for part in text.split(",") if part.strip()])


def read_hostfile(path: str) -> list[str]:
    """One host per line (or several, separated by spaces or commas); '#' starts a comment.
    An MPI hostfile's 'node slots=8' keeps the node name."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError as exc:
        raise UsageError(f"--hostfile: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--hostfile: {path} is not a text file") from None
    hosts = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        for word in re.split(r"[\s,]+", line.strip()):
            if word and "=" not in word:
                hosts.append(check_host(word))
    return _unique(hosts)


def parse_scontrol_hostnames(output: str) -> list[str]:
    """`scontrol show hostnames JOBID` prints one expanded node name per line."""
    return _unique([check_host(line.strip()) for line in output.splitlines() if line.strip()])


def slurm_hosts(jobid: str, timeout: float = 30.0) -> list[str]:
    if not _JOBID.match(jobid):
        raise UsageError(f"--slurm takes a job id like 12345 or 12345_7, not {jobid[:40]!r}")
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", jobid], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UsageError("--slurm needs Slurm's `scontrol` on this machine (not found in "
                         "PATH); use --hosts or --hostfile") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"--slurm: `scontrol show hostnames {jobid}` did not answer in "
                         f"{timeout:.0f} s") from None
    if done.returncode != 0:
        why = " ".join(done.stderr.split())[:200] or f"exit status {done.returncode}"
        raise UsageError(f"--slurm: scontrol: {why}")
    hosts = parse_scontrol_hostnames(done.stdout)
    if not hosts:
        raise UsageError(f"--slurm: job {jobid} has no nodes (not started yet?)")
    return hosts


def resolve_targets(hosts: str | None, hostfile: str | None, slurm: str | None) -> list[str]:
    """The nodes named by the options (at least one of them given)."""
    given = [name for name, value in (("--hosts", hosts), ("--hostfile", hostfile),
                                      ("--slurm", slurm)) if value is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)}: give one way to name the nodes")
    if hosts is not None:
        found = parse_hosts(hosts)
    elif hostfile is not None:
        found = read_hostfile(hostfile)
    else:
        found = slurm_hosts(str(slurm))
    if not found:
        raise UsageError(f"{given[0]}: no host given")
    if len(found) > MAX_HOSTS:
        raise UsageError(f"{len(found)} hosts: at most {MAX_HOSTS} at once")
    return found


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
