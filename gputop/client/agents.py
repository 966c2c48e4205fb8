"""The monitor's side of the agent's socket: find agents, talk to them, ask for captures.

Used by `gputop` (the live monitor's `p`, `gputop capture`, the sampler's telemetry probe), never
inside a training process; the training process's side is ``gputop.agent.server``, and what both
sides share (wire format, limits, peer checks, socket directories) is ``gputop.core.protocol``.
Everything here blocks: run it in a thread, never on an event loop.
"""

from __future__ import annotations

import dataclasses
import os
import re
import select
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Re-exported: callers of the client need the protocol's error and constants too.
from gputop.core.pidns import in_init_pidns, pid_alive
from gputop.core.protocol import (  # noqa: F401
    _NS_SOCKET_NAME,
    _SOCKET_NAME,
    COMMANDS,
    INIT_PIDNS,
    MAX_MESSAGE,
    PROTOCOL_VERSION,
    AgentError,
    _base_dirs,
    check_socket_dir,
    decode,
    default_capture_dir,
    encode,
    peer_credentials,
    pid_namespace,
    scoped_dir,
    socket_dir,
    socket_path,
)

# --- finding agents --------------------------------------------------------------------------


# Directory listings (/tmp, /run/user, the socket directories), kept while the directory's
# mtime (which any entry made, removed or renamed moves) stays the same, and for LISTING_KEEP_S
# at most (the kernel's timestamps are coarse: two changes within one clock tick leave the same
# mtime): the monitor looks for agents every tick, and /tmp on a shared node holds hundreds of
# entries.
LISTING_KEEP_S = 10.0
_listings: dict[tuple[str, Callable], tuple[tuple[int, int], float, Any]] = {}


def _listing(directory: str | Path, read: Callable[[str | Path], Any]) -> Any:
    """``read(directory)``, again only when the directory changed or LISTING_KEEP_S passed;
    raises OSError as os.stat does."""
    st = os.stat(directory)
    key = (st.st_ino, st.st_mtime_ns)
    now = time.monotonic()
    cached = _listings.get((str(directory), read))
    if cached is not None and cached[0] == key and now - cached[1] < LISTING_KEEP_S:
        return cached[2]
    value = read(directory)
    _listings[(str(directory), read)] = (key, now, value)
    return value


def _entries(directory: str) -> list[str]:
    try:
        return _listing(directory, os.listdir)
    except OSError:
        return []


_USER_TMP = re.compile(r"^gputop-([0-9]+)$")


def _search_dirs() -> list[tuple[Path, int]]:
    """Directories to look for agents in, with the uid that must own each.

    Ours (both the XDG and the /tmp location: the job and gputop may not agree on
    XDG_RUNTIME_DIR); as root, every user's too, since agents accept root. With
    $GPUTOP_SOCKET_DIR set, only that directory.
    """
    uid = os.geteuid()
    found = [(d, uid) for d in _base_dirs(uid)]
    if uid == 0 and scoped_dir() is None:
        found += _other_users(_entries("/tmp"), _entries("/run/user"))
    return found


# The last listings of /tmp and /run/user and the users' directories found in them: the
# listings are the same objects while the directories are unchanged (``_listing``), and /tmp on
# a shared node holds hundreds of entries to go through every tick otherwise.
_users_seen: tuple[list[str], list[str], list[tuple[Path, int]]] | None = None


def _other_users(tmp: list[str], run: list[str]) -> list[tuple[Path, int]]:
    global _users_seen
    seen = _users_seen
    if seen is not None and seen[0] is tmp and seen[1] is run:
        return seen[2]
    found = []
    for name in tmp:
        m = _USER_TMP.match(name) if name.startswith("gputop-") else None
        if m and int(m.group(1)) != 0:
            found.append((Path("/tmp") / name, int(m.group(1))))
    for name in run:
        if name.isdigit() and int(name) != 0:
            found.append((Path("/run/user") / name / "gputop", int(name)))
    _users_seen = (tmp, run, found)
    return found


def _pid_running(pid: int) -> bool:
    """Alive and not a zombie (an exited child its parent has not reaped yet)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return pid_alive(pid)


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


def _read_sockets(directory: str | Path) -> list[tuple[int, Path]]:
    """(pid, path) of the agent sockets in ``directory``."""
    found = []
    for entry in os.scandir(directory):
        m = _SOCKET_NAME.match(entry.name)
        if not m:
            continue
        try:
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                found.append((int(m.group(1)), Path(entry.path)))
        except OSError:
            continue
    return found


def agent_sockets() -> dict[int, tuple[Path, int]]:
    """pid -> (socket path, uid that owns its directory) of every agent we may talk to;
    removes sockets of dead processes."""
    agents: dict[int, tuple[Path, int]] = {}
    for directory, owner in _search_dirs():
        try:
            check_socket_dir(directory, owner)
            entries = _listing(directory, _read_sockets)
        except (OSError, AgentError):
            continue
        for pid, path in entries:
            if not pid_alive(pid):
                if in_init_pidns():  # in a container a plain name is a host pid, not ours
                    _unlink_quietly(path)
                continue
            agents.setdefault(pid, (path, owner))
    own_uid = os.geteuid()
    for pid, path in _own_namespaced_agents(agents).items():
        agents.setdefault(pid, (path, own_uid))
    return agents


def list_agents() -> dict[int, Path]:
    """pid -> socket path of every agent we may talk to; removes sockets of dead processes."""
    return {pid: path for pid, (path, _) in agent_sockets().items()}


def _own_namespaced_agents(found: dict[int, Any]) -> dict[int, Path]:
    """In a container's pid namespace: agents named ``<pid>-ns<our inode>.sock``."""
    own = pid_namespace()
    if own is None or own == INIT_PIDNS:
        return {}
    agents: dict[int, Path] = {}
    uid = os.geteuid()
    for directory in _base_dirs(uid):
        try:
            check_socket_dir(directory, uid)
            names = _entries(str(directory))
        except (OSError, AgentError):
            continue
        for name in names:
            m = _NS_SOCKET_NAME.match(name)
            if m and int(m.group(2)) == own and int(m.group(1)) not in found \
                    and pid_alive(int(m.group(1))):
                agents.setdefault(int(m.group(1)), directory / name)
    return agents


@dataclass(frozen=True)
class Located:
    """Where an agent listens: its socket, the uid owning its directory, the pid the kernel
    must show for its peer (0: a process this namespace cannot see) and the path prefix under
    which its files are (``/proc/H/root`` for another mount namespace, else empty)."""

    path: Path
    owner: int
    peer: tuple[int, ...]
    root: str = ""


# Searches beyond the plain one (agents in containers, gputop.client.namespaces), tried in order
# when the plain search finds no socket. Registered by their modules, so that this module never
# imports them (they use this one).
_LOCATORS: list[Callable[[int], Located | None]] = []


def add_locator(locate: Callable[[int], Located | None]) -> None:
    if locate not in _LOCATORS:
        _LOCATORS.append(locate)


def _locate(pid: int) -> Located | None:
    """The socket of ``pid``'s agent, the uid that owns its directory and the pids its peer
    may show (0 too for a host pid seen from a container: that process is invisible here)."""
    peers = own_peers(pid)
    for directory, owner in _search_dirs():
        path = directory / f"{pid}.sock"
        try:
            check_socket_dir(directory, owner)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                return Located(path, owner, peers)
        except (OSError, AgentError):
            continue
    for locate in _LOCATORS:  # containers, either way
        found = locate(pid)
        if found is not None:
            return found
    return None


def find_agent(pid: int) -> Path | None:
    found = _locate(pid)
    return found.path if found else None


# --- client --------------------------------------------------------------------------------


def own_peers(pid: int) -> tuple[int, ...]:
    """The pids the kernel may show for the peer of ``pid``'s socket from here: ``pid``, and 0
    too in a container (a host pid there is a process this namespace cannot see)."""
    return (pid,) if in_init_pidns() else (pid, 0)


def check_peer(sock: socket.socket, pid: int, owner: int, path: Path,
               peers: tuple[int, ...] | None = None) -> int:
    """The uid at the other end of a connected agent socket. Trust the other end only if it is
    the process the socket is named after (one of ``peers``, default ``pid``), run by the owner
    of the directory (or root): nobody can answer in another process's name. Raises AgentError
    ("refused") otherwise."""
    try:
        peer_pid, uid = peer_credentials(sock)
    except OSError:
        peer_pid, uid = -1, -1
    if peer_pid not in (peers or (pid,)) or uid not in (owner, 0):
        raise AgentError(
            f"socket {path} is served by pid {peer_pid} (uid {uid}), not by pid {pid} of "
            f"uid {owner}; refusing to talk to it",
            "refused",
        )
    return uid


class AgentConnection:
    """One connection to one agent; several requests may go over it, one at a time."""

    def __init__(self, pid: int, timeout: float = 2.0, path: Path | None = None,
                 peers: tuple[int, ...] | None = None) -> None:
        self.pid = pid
        self.timeout = timeout
        owner = os.geteuid()
        self.root = ""  # the prefix of the agent's files from here (another mount namespace)
        if path is None:
            found = _locate(pid)
            if found is None:
                raise AgentError(no_agent_hint(pid), "no-agent")
            path, owner, peers, self.root = found.path, found.owner, found.peer, found.root
        peers = (pid,) if peers is None else peers
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
            raise AgentError(no_agent_hint(pid), "no-agent") from None
        except FileNotFoundError:
            self.sock.close()
            raise AgentError(no_agent_hint(pid), "no-agent") from None
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
        try:
            self.peer_uid = check_peer(self.sock, pid, owner, path, peers)
        except AgentError:
            self.sock.close()
            raise

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


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(8192)
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def no_agent_hint(pid: int) -> str:
    """Why ``pid`` has no agent we can reach, and the fix that fits where the user is."""
    if not pid_alive(pid):
        return f"no process with pid {pid}"
    argv = _cmdline(pid)
    if "gputop.demo.standin" in argv:
        import importlib.util

        where = ("GPU 0 of `gputop --demo input-starved` (and of `--demo tour`) runs a real "
                 "torch training job that "
                 "`p` captures")
        if importlib.util.find_spec("torch") is None:
            return (f"pid {pid} is a stand-in of the simulated demo, not a training job; {where} "
                    "once torch is installed: `pip install torch` (the CPU build is enough), "
                    "then restart the demo")
        return f"pid {pid} is a stand-in of the simulated demo, not a training job; {where}"
    owner = _owner(pid)
    if owner is not None and owner != os.geteuid() and os.geteuid() != 0:
        return (f"pid {pid} belongs to uid {owner}: only that user or root can reach its gputop "
                "agent")
    return (f"pid {pid} has no gputop agent: start the job with `gputop run -- python train.py` "
            "(or call gputop.agent.install() in it)")


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

def request_flop_count(pid: int, timeout: float = 120.0) -> dict[str, Any]:
    """Ask the agent of ``pid`` to count its next step's FLOPs; its reply once the step ended
    (``flops_per_step``, ``precision``, ``cost_s``...). Raises AgentError (one line)."""
    with AgentConnection(pid, timeout + REPLY_MARGIN_S) as conn:
        return conn.call({"cmd": "flops", "timeout": timeout})


# --- captures --------------------------------------------------------------------------------

# A capture's timeout is the user's: the client gives up that long after asking, plus this
# grace for the agent's reply to arrive (it was 30 s: `--timeout 10` against an agent that never
# answers took 40 s). The reply after the deadline still has the profiler's stop and the trace's
# export to do (a time window of all threads, with torch._dynamo imported on the way: 3-6 s on
# a busy 2-core machine; 2 s was too short). Leaving cancels the capture in the agent.
REPLY_MARGIN_S = 8.0
POLL_S = 0.25  # how often progress and should_stop are looked at while waiting

Progress = Callable[[dict[str, Any]], None]


def capture_message(steps: int, timeout: float, out: str | None = None,
                    with_stack: bool = False, start_step: int | None = None,
                    warmup: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"cmd": "capture", "steps": steps, "timeout": timeout}
    if start_step is not None:  # every rank of a job starts at this optimizer step
        message["start_step"] = start_step
    if warmup is not None:
        message["warmup"] = warmup
    if with_stack:  # Python stacks: the report can name the source lines of the top costs
        message["with_stack"] = True
    out = out or os.environ.get("GPUTOP_CAPTURE_DIR")
    if out:
        message["out"] = os.path.abspath(os.path.expanduser(out))
    return message


def progress_text(capture: dict[str, Any]) -> str:
    """The agent's ``status["capture"]`` in a few words: "recording step 2/3"."""
    state = capture.get("state") or "starting"
    if state in ("warmup", "recording") and capture.get("mode") == "steps":
        return f"{state} step {capture.get('steps_done', 0)}/{capture.get('steps_total')}"
    if state == "waiting":
        return "waiting for the next optimizer step"
    return str(state)


def request_capture(
    pid: int,
    steps: int = 3,
    timeout: float = 60.0,
    *,
    out: str | None = None,
    on_progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    with_stack: bool = False,
    start_step: int | None = None,
    warmup: int | None = None,
    message: dict[str, Any] | None = None,
    path_key: str = "trace",
) -> dict[str, Any]:
    """Record ``steps`` optimizer steps of ``pid`` (or send ``message``, a whole capture
    request); returns the agent's reply (with "trace", or the file ``path_key`` names).

    ``on_progress`` gets the agent's ``status["capture"]`` dict about every POLL_S seconds;
    when ``should_stop()`` turns true the request is abandoned (the agent cancels it).
    Every failure raises ``AgentError`` with a one-line message.
    """
    deadline = time.monotonic() + timeout + REPLY_MARGIN_S
    with AgentConnection(pid, timeout=5.0) as conn:
        conn.send(message or capture_message(steps, timeout, out, with_stack, start_step,
                                             warmup))
        while not conn.wait_readable(POLL_S):
            if should_stop is not None and should_stop():
                raise AgentError(f"capture of pid {pid} abandoned", "cancelled")
            if time.monotonic() > deadline:
                raise AgentError(f"agent of pid {pid} did not answer in time", "timeout")
            if on_progress is not None:
                status = agent_status(pid, timeout=POLL_S)
                if status is not None and isinstance(status.get("capture"), dict):
                    on_progress(status["capture"])
        try:
            reply = check_reply(conn.receive(max(0.1, deadline - time.monotonic())), pid)
        except AgentError as exc:
            if exc.code == "exited":
                # The agent may have said more: "... before the capture finished (why)".
                detail = str(exc).partition("before the capture finished")[2].strip()
                raise AgentError(f"process {pid} exited during the capture"
                                 + (f" {detail}" if detail.startswith("(") else ""),
                                 "exited") from None
            raise
    return checked_trace_reply(reply, pid, conn.peer_uid, conn.root, path_key)


MAX_TRACE_PATH = 4096


def checked_trace_reply(reply: dict[str, Any], pid: int, peer_uid: int,
                        root: str = "", key: str = "trace") -> dict[str, Any]:
    """The agent's capture reply with its trace path (or the file ``key`` names) checked, and
    ``agent_uid`` set from the socket's credentials (never from what the agent says): an agent
    is untrusted input. ``root``: where the agent's files are from here (``/proc/PID/root``
    for a container)."""
    trace = reply.get(key)
    if (not isinstance(trace, str) or not trace or len(trace) > MAX_TRACE_PATH
            or "\0" in trace or not os.path.isabs(trace)):
        what = "trace" if key == "trace" else key
        raise AgentError(f"agent of pid {pid} replied without a usable {what} path", "protocol")
    return {**reply, key: root + trace, "agent_uid": peer_uid}


def partial_note(reply: dict[str, Any]) -> str | None:
    """Why the trace holds fewer steps than asked (the process exited or was stopped during the
    capture and the agent saved what it had recorded), or None for a whole trace."""
    if reply.get("partial") is not True:
        return None
    from gputop.core.format import safe_text

    why = reply.get("partial_reason")
    why = safe_text(why[:200]) if isinstance(why, str) and why else "the capture ended early"
    return f"partial trace: {why}"


def trace_limits(reply: dict[str, Any]):
    """How to read the trace an agent named: no larger than the size budget of the capture
    asked for (an agent writes no more: ``protocol.JSON_PER_STEP`` per recorded step; a
    sparse 5 GB file is refused unread); as another user's file (root capturing a user's
    job), a regular file owned by the agent's user, not reached through a link."""
    from gputop.core.protocol import DEFAULT_STEPS, JSON_PER_STEP, MAX_STEPS
    from gputop.diagnostics.trace.loading.load import LoadLimits

    steps = reply.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or reply.get("mode") != "steps":
        steps = DEFAULT_STEPS
    budget = JSON_PER_STEP * min(MAX_STEPS, max(1, steps)) + (1 << 20)  # and the header
    limits = LoadLimits(max_bytes=budget, bytes_limit_name="the capture's size budget")
    uid = reply.get("agent_uid")
    if isinstance(uid, int) and uid != os.geteuid():
        return dataclasses.replace(limits, owner_uid=uid, follow_links=False)
    return limits
