"""The agent's wire format, socket discovery and client, shared by both sides.

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
import select
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = 1
MAX_MESSAGE = 64 * 1024
COMMANDS = ("hello", "status", "capture", "cancel")

_SOCKET_NAME = re.compile(r"^([1-9][0-9]{0,9})\.sock$")
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


def _base_dirs(uid: int) -> list[Path]:
    """Candidate socket directories for ``uid``, preferred first (they may not exist)."""
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

    ``$XDG_RUNTIME_DIR/gputop`` when XDG_RUNTIME_DIR exists, is ours and is private, else
    ``/tmp/gputop-<uid>``. With ``create``, make it (mode 0700) and tighten a loose mode. Raises
    AgentError for a symlink or a directory owned by someone else (a squatter in /tmp).
    """
    uid = os.geteuid()
    path = _base_dirs(uid)[0]
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise AgentError(f"cannot create {path}: {exc.strerror}", "socket-dir") from None
    try:
        check_socket_dir(path, uid)
    except FileNotFoundError:
        return path  # nothing there yet: nothing to refuse
    if create and os.lstat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def socket_path(pid: int, directory: Path | None = None) -> Path:
    return (directory or socket_dir()) / f"{pid}.sock"


def _search_dirs() -> list[tuple[Path, int]]:
    """Directories to look for agents in, with the uid that must own each.

    Ours (both the XDG and the /tmp location: the job and gputop may not agree on
    XDG_RUNTIME_DIR); as root, every user's too, since agents accept root.
    """
    uid = os.geteuid()
    found = [(d, uid) for d in _base_dirs(uid)]
    if uid == 0:
        try:
            names = os.listdir("/tmp")
        except OSError:
            names = []
        for name in names:
            m = re.match(r"^gputop-([0-9]+)$", name)
            if m and int(m.group(1)) != 0:
                found.append((Path("/tmp") / name, int(m.group(1))))
        try:
            users = os.listdir("/run/user")
        except OSError:
            users = []
        for name in users:
            if name.isdigit() and int(name) != 0:
                found.append((Path("/run/user") / name / "gputop", int(name)))
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_running(pid: int) -> bool:
    """Alive and not a zombie (an exited child its parent has not reaped yet)."""
    if not _pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return _pid_alive(pid)


def _exits_soon(pid: int, grace: float = 2.0) -> bool:
    """After the agent hung up on us: is its process going away (it may still be exiting)?"""
    deadline = time.monotonic() + grace
    while _pid_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def list_agents() -> dict[int, Path]:
    """pid -> socket path of every agent we may talk to; removes sockets of dead processes."""
    agents: dict[int, Path] = {}
    for directory, owner in _search_dirs():
        try:
            check_socket_dir(directory, owner)
            entries = list(os.scandir(directory))
        except (OSError, AgentError):
            continue
        for entry in entries:
            m = _SOCKET_NAME.match(entry.name)
            if not m:
                continue
            pid = int(m.group(1))
            try:
                if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    continue
            except OSError:
                continue
            if not _pid_alive(pid):
                _unlink_quietly(Path(entry.path))
                continue
            agents.setdefault(pid, Path(entry.path))
    return agents


def _locate(pid: int) -> tuple[Path, int] | None:
    """The socket of ``pid``'s agent and the uid that owns its directory."""
    for directory, owner in _search_dirs():
        path = directory / f"{pid}.sock"
        try:
            check_socket_dir(directory, owner)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                return path, owner
        except (OSError, AgentError):
            continue
    return None


def find_agent(pid: int) -> Path | None:
    found = _locate(pid)
    return found[0] if found else None


# --- client --------------------------------------------------------------------------------


class AgentConnection:
    """One connection to one agent; several requests may go over it, one at a time."""

    def __init__(self, pid: int, timeout: float = 2.0, path: Path | None = None) -> None:
        self.pid = pid
        self.timeout = timeout
        owner = os.geteuid()
        if path is None:
            found = _locate(pid)
            if found is None:
                raise AgentError(_no_agent_message(pid), "no-agent")
            path, owner = found
        self.path = path
        self._buffer = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except ConnectionRefusedError:
            self.sock.close()
            # Nobody listens: the process died (or its pid was reused) and left the file. An
            # agent only gives its socket the final name once it listens, so this is stale.
            _unlink_quietly(path)
            raise AgentError(_no_agent_message(pid), "no-agent") from None
        except FileNotFoundError:
            self.sock.close()
            raise AgentError(_no_agent_message(pid), "no-agent") from None
        except TimeoutError:
            self.sock.close()
            raise AgentError(
                f"agent of pid {pid} did not accept within {timeout:g} s", "timeout"
            ) from None
        except OSError as exc:
            self.sock.close()
            raise AgentError(
                f"cannot connect to the agent of pid {pid}: {exc.strerror}", "refused"
            ) from None
        # Trust the other end only if it is the process the socket is named after, run by the
        # owner of the directory (or root): nobody can answer in another process's name.
        try:
            peer_pid, uid = peer_credentials(self.sock)
        except OSError:
            peer_pid, uid = -1, -1
        if peer_pid != pid or uid not in (owner, 0):
            self.sock.close()
            raise AgentError(
                f"socket {path} is served by pid {peer_pid} (uid {uid}), not by pid {pid} of "
                f"uid {owner}; refusing to talk to it",
                "refused",
            )

    def __enter__(self) -> AgentConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.sendall(encode(message))
        except (BrokenPipeError, ConnectionResetError):
            raise AgentError(f"process {self.pid} closed the connection", "exited") from None
        except TimeoutError:
            raise AgentError(
                f"agent of pid {self.pid} did not read the request", "timeout"
            ) from None

    def receive(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for one reply (up to ``timeout`` seconds, default the connection's)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_MESSAGE:
                raise AgentError(f"agent of pid {self.pid} sent an oversized reply", "protocol")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.wait_readable(remaining):
                raise AgentError(f"agent of pid {self.pid} did not answer in time", "timeout")
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                chunk = b""
            if not chunk:
                gone = _exits_soon(self.pid)
                raise AgentError(
                    f"process {self.pid} exited before answering"
                    if gone
                    else f"agent of pid {self.pid} closed the connection",
                    "exited" if gone else "refused",
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return decode(line)
        except ValueError as exc:
            raise AgentError(f"unreadable reply from pid {self.pid}: {exc}", "protocol") from None

    def wait_readable(self, timeout: float) -> bool:
        try:
            readable, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        except (OSError, ValueError):
            return True  # let recv report what is wrong
        return bool(readable)

    def call(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send a request and return its reply; an error reply raises AgentError."""
        self.send(message)
        return check_reply(self.receive(timeout), self.pid)


def check_reply(reply: dict[str, Any], pid: int) -> dict[str, Any]:
    if reply.get("ok") is True:
        return reply
    message = reply.get("message") or reply.get("error") or "error reply"
    raise AgentError(f"agent of pid {pid}: {message}", str(reply.get("error") or "error"))


def _no_agent_message(pid: int) -> str:
    if not _pid_alive(pid):
        return f"no process with pid {pid}"
    return (
        f"process {pid} has no gputop agent (start the job with `gputop run -- CMD`, "
        "or call gputop.agent.install() in it)"
    )


def request(pid: int, message: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """One request to the agent of ``pid``; raises AgentError (one line) on any failure."""
    with AgentConnection(pid, timeout) as conn:
        return conn.call(message)


def agent_status(pid: int, timeout: float = 0.5) -> dict[str, Any] | None:
    """The agent's ``status`` reply, or None when there is no agent or it does not answer."""
    try:
        return request(pid, {"cmd": "status"}, timeout)
    except (AgentError, OSError, ValueError):
        return None


# --- where traces go -----------------------------------------------------------------------


def default_capture_dir() -> Path:
    """``$GPUTOP_CAPTURE_DIR``, else ``$XDG_STATE_HOME/gputop/captures`` (~/.local/state/...)."""
    explicit = os.environ.get("GPUTOP_CAPTURE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "gputop" / "captures"
