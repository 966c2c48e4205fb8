"""A process's environment and full command line, for the monitor's `e` view.

Read from /proc through psutil, once, when asked (never per tick). Another user's process is
untrusted input: the number of variables and each value's length are bounded and control
characters escaped. Values whose names say they are secrets (*TOKEN*, *KEY*, *SECRET*,
*PASSWORD*, and a few common spellings of the same) are masked: a monitor on a shared
screen must not show them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gputop.core.format import safe_text

MAX_VARIABLES = 1000
MAX_VALUE = 4000  # characters of one value, and of the command line
MASK = "******"
# Names that carry secrets: a substring match, case-insensitive (HF_TOKEN, AWS_SECRET_ACCESS_KEY,
# WANDB_API_KEY, PGPASSWORD, GITHUB_PAT-style names with TOKEN in them).
SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


@dataclass(frozen=True)
class ProcessEnvironment:
    pid: int
    command: str  # the full command line, escaped and bounded
    variables: tuple[tuple[str, str], ...]  # (name, value) sorted by name, secrets masked
    masked: int  # how many values were masked
    cut: int  # variables left out past MAX_VARIABLES
    error: str | None = None  # why it could not be read (one line)


def masked_value(name: str, value: str) -> str:
    """``value`` as shown: masked when ``name`` says it is a secret, else bounded and
    escaped."""
    if SECRET.search(name):
        return MASK
    return _bounded(value)


def _bounded(text: str) -> str:
    text = safe_text(text)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE] + "…"


def read_environment(pid: int) -> ProcessEnvironment:
    """``pid``'s environment and command line; a process that ended or that this user may
    not read gives an ``error`` line instead of raising."""
    import psutil

    try:
        proc = psutil.Process(pid)
        command = " ".join(proc.cmdline())
        env = proc.environ()
    except psutil.NoSuchProcess:
        return ProcessEnvironment(pid, "", (), 0, 0, f"pid {pid} has ended")
    except (psutil.AccessDenied, PermissionError):
        return ProcessEnvironment(pid, "", (), 0, 0,
                                  f"not allowed to read the environment of pid {pid} "
                                  "(another user's process: run gputop as that user or root)")
    except OSError as exc:
        return ProcessEnvironment(pid, "", (), 0, 0, f"pid {pid}: {exc.strerror or exc}")
    names = sorted(env)
    kept = names[:MAX_VARIABLES]
    variables = tuple((_bounded(name)[:200], masked_value(name, env[name])) for name in kept)
    masked = sum(1 for name in kept if SECRET.search(name))
    return ProcessEnvironment(pid, _bounded(command), variables, masked,
                              len(names) - len(kept))
