"""May we read another process's stacks? The kernel's ptrace rules, checked without ptrace.

py-spy reads the target's memory (``process_vm_readv``), which the kernel allows only under
the ptrace access rules: the same user (or CAP_SYS_PTRACE), a dumpable target, and whatever
Yama's ``kernel.yama.ptrace_scope`` adds. Opening ``/proc/PID/mem`` goes through the same
check (``ptrace_may_access`` in attach mode), so it answers "allowed?" at no cost and without
touching the target. When it is refused, ``refusal`` names the rule that refused it and what
would allow it, in one line.
"""

from __future__ import annotations

import errno
import os
import pwd

CAP_SYS_PTRACE = 19
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


class StacksError(Exception):
    """Stacks cannot be read; the message is one line, meant for the user."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code  # "denied", "no-process", "not-python", "no-py-spy", "error"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return None


def yama_scope() -> int | None:
    """``kernel.yama.ptrace_scope`` (0-3), or None without Yama."""
    text = _read(YAMA_SCOPE)
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def _status_field(pid: int | str, name: str) -> str | None:
    text = _read(f"/proc/{pid}/status")
    for line in (text or "").splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


def _has_cap(pid: int | str, cap: int, field: str = "CapEff") -> bool:
    value = _status_field(pid, field)
    try:
        return bool(int(value or "0", 16) >> cap & 1)
    except ValueError:
        return False


def can_ptrace() -> bool:
    """Does this process hold CAP_SYS_PTRACE (root on a host, not in most containers)?"""
    return _has_cap("self", CAP_SYS_PTRACE)


def owner_uid(pid: int) -> int | None:
    """The real uid of ``pid`` (``/proc/PID`` itself belongs to root when the process is not
    dumpable, so its owner is not the answer)."""
    uids = _status_field(pid, "Uid")
    try:
        return int(uids.split()[0]) if uids else None
    except (ValueError, IndexError):
        return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"


def refusal(pid: int) -> str | None:
    """None when this process may read ``pid``'s memory, else one line: why not, and what
    would allow it. Raises StacksError("no-process") when there is no such process."""
    try:
        os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC))
        return None
    except FileNotFoundError:
        raise StacksError(f"no process with pid {pid}", "no-process") from None
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise StacksError(f"no process with pid {pid}", "no-process") from None
        if exc.errno not in (errno.EACCES, errno.EPERM):
            return f"cannot read the memory of pid {pid}: {exc.strerror}"
    return explain_refusal(pid)


def explain_refusal(pid: int) -> str:
    """Which ptrace rule refuses ``pid`` to us, and what would allow it (one line)."""
    head = f"cannot read the Python stacks of pid {pid}:"
    sudo = f"run `sudo gputop stacks {pid}`"
    scope = yama_scope()
    cap = can_ptrace()
    if scope == 3:
        return (f"{head} ptrace is disabled on this machine (kernel.yama.ptrace_scope=3, "
                "fixed until reboot); nothing can read another process's stacks: start the job "
                "with `gputop run` next time to use the agent instead")
    if scope == 2 and not cap:
        return (f"{head} kernel.yama.ptrace_scope=2 lets only processes with CAP_SYS_PTRACE "
                f"attach: {sudo}")
    me, owner = os.getuid(), owner_uid(pid)
    if owner is not None and owner != me and not cap:
        if me == 0:  # root without CAP_SYS_PTRACE: a container started without it
            return (f"{head} it belongs to {user_name(owner)} and this container lacks "
                    "SYS_PTRACE: start it with `--cap-add SYS_PTRACE`, or run gputop on the "
                    "host as root")
        return (f"{head} it belongs to {user_name(owner)} (uid {owner}) and you are "
                f"{user_name(me)}: only that user or root may read it; {sudo}, or run gputop "
                f"as {user_name(owner)}")
    if scope == 1 and not cap:
        return (f"{head} kernel.yama.ptrace_scope=1 lets a process read only its own "
                f"descendants: {sudo}, or allow it for your user with "
                "`sudo sysctl kernel.yama.ptrace_scope=0`")
    if not cap:
        bounded = _has_cap("self", CAP_SYS_PTRACE, "CapBnd")
        why = (f"{head} the process is not dumpable (it set PR_SET_DUMPABLE=0, or runs a "
               "setuid or file-capability program), so only CAP_SYS_PTRACE may read it")
        if not bounded:
            return (f"{why}, which this process cannot have (a container started without "
                    "SYS_PTRACE): start it with `--cap-add SYS_PTRACE`, or run gputop on the "
                    "host as root")
        return f"{why}: {sudo}"
    return (f"{head} the kernel refused ptrace access even with CAP_SYS_PTRACE (a security "
            "module such as AppArmor or SELinux?); check `dmesg` for a denial")
