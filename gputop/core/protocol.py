"""Both sides of the agent's socket: the wire format, limits, peer checks and where sockets live.

One Unix stream socket per agent process, named ``<pid>.sock`` in a private per-user directory.
Messages are JSON objects, one per line (UTF-8, ``\\n``-terminated), at most ``MAX_MESSAGE``
bytes. Every request carries ``"cmd"``; every reply carries ``"ok"``, and error replies carry
``"error"`` (a short code) and ``"message"`` (one line). Never pickle: a peer is only trusted to
send JSON.

This module is imported inside training processes: stdlib only, never torch or textual.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import struct
from pathlib import Path
from typing import Any

from gputop.core.pidns import INIT_PIDNS, ns_inode

PROTOCOL_VERSION = 1
MAX_MESSAGE = 64 * 1024
COMMANDS = ("hello", "status", "capture", "cancel", "seen", "flops", "memory", "fr_dump")
# Where a training process's time goes: the agent's goodput ledger books every second into one
# of these, the monitor's efficiency ledger reads them back (``status["goodput"]``).
GOODPUT_CATEGORIES = ("productive", "startup", "dataloader", "capture", "checkpoint", "stall",
                      "hang")
# A capture's size: the agent records at most MAX_STEPS steps (DEFAULT_STEPS unless asked) and
# writes at most JSON_PER_STEP bytes of trace per recorded step (a time window counts as 3);
# the monitor reads no more than that budget back.
MAX_STEPS = 1000
DEFAULT_STEPS = 3
JSON_PER_STEP = 32 << 20

_SOCKET_NAME = re.compile(r"^([1-9][0-9]{0,9})\.sock$")
# An agent in a pid namespace other than the host's names its socket with the namespace too
# (``<pid>-ns<inode>.sock``): pid 1 of two containers sharing /tmp must not collide.
_NS_SOCKET_NAME = re.compile(r"^([1-9][0-9]{0,9})-ns([1-9][0-9]{0,11})\.sock$")
_PEERCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


class AgentError(Exception):
    """A request to an agent failed; ``str()`` is one line for the user, ``code`` a short id.

    Codes: ``no-agent``, ``refused``, ``timeout``, ``exited`` (the process went away while we
    waited), ``protocol`` (a reply we could not read), or the ``error`` code of an error reply
    (``busy``, ``no-steps``, ``bad-request``, ``capture-dir``, ...).
    """

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


# --- wire format ---------------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line of JSON; raises ValueError when it is over the size cap."""
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"message of {len(data)} bytes is over the {MAX_MESSAGE} byte cap")
    return data


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line; raises ValueError (with a one-line reason) unless it is a JSON object."""
    if len(line) > MAX_MESSAGE:
        raise ValueError(f"message over the {MAX_MESSAGE} byte cap")
    try:
        value = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("message is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"message is not JSON ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise ValueError("message is not a JSON object")
    return value


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket (SO_PEERCRED)."""
    pid, uid, _gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return pid, uid


def peer_uid(sock: socket.socket) -> int:
    return peer_credentials(sock)[1]


def peer_allowed(uid: int) -> bool:
    """Only our own user, or root, may talk to an agent (and be trusted as one)."""
    return uid == os.geteuid() or uid == 0


# --- where sockets live --------------------------------------------------------------------


def _private_dir(path: Path, uid: int) -> bool:
    """True when ``path`` is a real directory (not a symlink) owned by ``uid``, mode go-rwx."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and st.st_mode & 0o077 == 0


# Discovery scope: when set, agents listen in this one directory and gputop looks for agents
# only there (no other directory, no other user's, even as root). A job started with it set
# (``gputop run`` passes the environment on) is then seen only by a gputop with the same
# setting: the tests set it per run so that other jobs on the host cannot change their results,
# and users may set it to keep one group of jobs apart (docs/agent.md).
SOCKET_DIR_ENV = "GPUTOP_SOCKET_DIR"


def scoped_dir() -> Path | None:
    """The directory named by $GPUTOP_SOCKET_DIR (made absolute), or None when unset."""
    value = os.environ.get(SOCKET_DIR_ENV)
    return Path(os.path.abspath(os.path.expanduser(value))) if value else None


def _base_dirs(uid: int) -> list[Path]:
    """Candidate socket directories for ``uid``, preferred first (they may not exist)."""
    scoped = scoped_dir()
    if scoped is not None:
        return [scoped]
    dirs = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and uid == os.geteuid() and _private_dir(Path(xdg), uid):
        dirs.append(Path(xdg) / "gputop")
    dirs.append(Path("/tmp") / f"gputop-{uid}")
    return dirs


def check_socket_dir(path: Path, uid: int | None = None) -> None:
    """Refuse a socket directory that is a symlink, not a directory, or someone else's."""
    uid = os.geteuid() if uid is None else uid
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise AgentError(f"refusing socket directory {path}: it is a symlink", "socket-dir")
    if not stat.S_ISDIR(st.st_mode):
        raise AgentError(f"refusing socket directory {path}: not a directory", "socket-dir")
    if st.st_uid != uid:
        raise AgentError(
            f"refusing socket directory {path}: owned by uid {st.st_uid}, not {uid}", "socket-dir"
        )


def socket_dir(create: bool = False) -> Path:
    """This user's agent socket directory.

    ``$GPUTOP_SOCKET_DIR`` when set, else ``$XDG_RUNTIME_DIR/gputop`` when XDG_RUNTIME_DIR
    exists, is ours and is private, else ``/tmp/gputop-<uid>``. With ``create``, make it (mode
    0700); a loose mode is tightened only on the directories gputop names for itself: a
    ``$GPUTOP_SOCKET_DIR`` that exists keeps its mode (root setting it to ``/tmp`` must not
    lock every user out), but one that anyone may write to without the sticky bit is refused
    (anyone could replace a socket in it). Raises AgentError for a symlink or a directory owned
    by someone else (a squatter in /tmp).
    """
    uid = os.geteuid()
    path = _base_dirs(uid)[0]
    made = False
    if create:
        try:
            os.mkdir(path, 0o700)
            made = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise AgentError(f"cannot create {path}: {exc.strerror}", "socket-dir") from None
    try:
        check_socket_dir(path, uid)
    except FileNotFoundError:
        return path  # nothing there yet: nothing to refuse
    mode = os.lstat(path).st_mode
    if not create or made or not mode & 0o077:
        return path
    if scoped_dir() is None:  # /tmp/gputop-<uid> or $XDG_RUNTIME_DIR/gputop: ours by name
        os.chmod(path, 0o700)
    elif mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise AgentError(f"refusing socket directory {path}: anyone may write to it and it "
                         "has no sticky bit", "socket-dir")
    return path


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace (None when /proc cannot tell)."""
    return ns_inode("self")


def socket_name(pid: int, pidns: int | None = None) -> str:
    """``<pid>.sock`` in the host's pid namespace, ``<pid>-ns<inode>.sock`` in another."""
    if pidns is None or pidns == INIT_PIDNS:
        return f"{pid}.sock"
    return f"{pid}-ns{pidns}.sock"


def socket_path(pid: int, directory: Path | None = None) -> Path:
    return (directory or socket_dir()) / f"{pid}.sock"


# --- where traces go -----------------------------------------------------------------------


def default_capture_dir() -> Path:
    """``$GPUTOP_CAPTURE_DIR``, else ``$XDG_STATE_HOME/gputop/captures`` (~/.local/state/...)."""
    explicit = os.environ.get("GPUTOP_CAPTURE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "gputop" / "captures"
