"""The sampler's look at every agent: all of them at once, within one deadline per tick.

Each tick asks every agent socket the monitor may talk to for ``status``. As root that is
every user's, so each socket is another user's to answer or not, and none may hold up the tick
(which samples the GPUs and everybody else's jobs too). So the requests go out at once over
non-blocking connections, and the tick waits for the replies until one deadline,
``PROBE_DEADLINE_S``, however many sockets there are. A socket that misses it is remembered as
quiet: no tick waits for it again. A background thread asks it once more straight away (with
``RETRY_TIMEOUT_S``: an agent in a busy process may just have been slow), then after a backoff
of 5 s doubling to 60 s; when it answers, the next tick uses that answer and it is no longer
quiet.

The bound: agents add at most ``PROBE_DEADLINE_S`` (0.5 s) to a tick, however many sockets
there are and whatever they do, and only in a tick in which a socket not yet known to be quiet
fails to answer; at most ``MAX_AT_ONCE`` sockets are asked per tick (those that answered
before first).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputop.client import agents as client
from gputop.core.agent_status import AgentStatus, parse_status
from gputop.core.protocol import MAX_MESSAGE, AgentError, decode, encode

PROBE_DEADLINE_S = 0.5  # the longest a tick waits for all agents together
RETRY_TIMEOUT_S = 2.0  # a quiet socket's retry, off the sampling thread
BACKOFF_FIRST_S = 5.0
BACKOFF_MAX_S = 60.0
MAX_AT_ONCE = 256  # sockets asked per tick (file descriptors, and the tick's own work)

_REQUEST = encode({"cmd": "status"})

Sockets = dict[int, tuple[Path, int]]  # pid -> (socket path, uid that owns its directory)
_Key = tuple[int, str]  # (pid, socket path): a new agent under a reused pid has a new key


def _key(pid: int, path: Path) -> _Key:
    return pid, str(path)


def _connect(pid: int, path: Path, owner: int) -> socket.socket | None:
    """A non-blocking connection with the request sent, or None when there is nobody to ask
    (a stale socket, a peer that is not the agent). Raises BlockingIOError when the socket
    does not take the connection or the request at once (a full backlog): a quiet socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setblocking(False)
        try:
            sock.connect(str(path))
        except ConnectionRefusedError:
            client._unlink_quietly(path)  # nobody listens: a dead process's socket
            sock.close()
            return None
        client.check_peer(sock, pid, owner, path, client.own_peers(pid))
        if sock.send(_REQUEST) != len(_REQUEST):
            raise BlockingIOError("request not taken whole")
        return sock
    except BlockingIOError:
        sock.close()
        raise
    except (OSError, AgentError):
        sock.close()
        return None


def ask_all(agents: Sockets, timeout: float) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """Ask every agent for its status at once and wait for the replies until ``timeout``.

    Returns the status replies of the agents that answered, and the pids of those that did not
    answer in time. Never raises; an agent that refuses, hangs up or answers nonsense is in
    neither."""
    deadline = time.monotonic() + timeout
    answers: dict[int, dict[str, Any]] = {}
    silent: set[int] = set()
    buffers: dict[int, bytearray] = {}
    with selectors.DefaultSelector() as selector:
        try:
            for pid, (path, owner) in agents.items():
                try:
                    sock = _connect(pid, path, owner)
                except BlockingIOError:
                    silent.add(pid)
                    continue
                if sock is not None:
                    buffers[pid] = bytearray()
                    selector.register(sock, selectors.EVENT_READ, pid)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(remaining):
                    pid = key.data
                    reply = _read(key.fileobj, buffers[pid])
                    if reply is None:
                        continue  # more to come
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
                    if isinstance(reply, dict) and reply.get("ok") is True:
                        answers[pid] = reply
        finally:
            for key in list(selector.get_map().values()):
                silent.add(key.data)
                selector.unregister(key.fileobj)
                key.fileobj.close()
    return answers, silent


def _read(sock: socket.socket, buffer: bytearray) -> dict[str, Any] | bool | None:
    """One read: the decoded reply once its line is whole, False when the connection ended
    without one (or it is unreadable or oversized), None while more is to come."""
    try:
        chunk = sock.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        return False
    if not chunk:
        return False
    buffer += chunk
    line, newline, _ = buffer.partition(b"\n")
    if not newline:
        return False if len(buffer) > MAX_MESSAGE else None
    try:
        return decode(bytes(line))
    except ValueError:
        return False


@dataclass
class _Quiet:
    due: float  # time.monotonic() of the next retry
    misses: int = 0  # retries that got no answer either
    asking: bool = False


class StatusProbe:
    """The sampler's ``AgentProbe`` (``collect.sampler``): call it once per tick; it returns
    ``{pid: status}`` of the agents that answered. Keeps the quiet sockets between ticks."""

    def __init__(self, deadline: float = PROBE_DEADLINE_S,
                 retry_timeout: float = RETRY_TIMEOUT_S) -> None:
        self.deadline = deadline
        self.retry_timeout = retry_timeout
        self._lock = threading.Lock()
        self._quiet: dict[_Key, _Quiet] = {}
        self._late: dict[_Key, dict[str, Any]] = {}  # answers the retries got, for next tick
        self._answered: set[_Key] = set()
        self._retrying = False
        self._steps: dict[_Key, int] = {}  # each agent's last step count: a counter never goes back

    def quiet(self) -> set[_Key]:
        with self._lock:
            return set(self._quiet)

    def __call__(self, _gpu_pids: set[int]) -> dict[int, AgentStatus]:
        sockets = client.agent_sockets()
        keys = {_key(pid, path): pid for pid, (path, _) in sockets.items()}
        with self._lock:
            for gone in self._quiet.keys() - keys.keys():
                del self._quiet[gone]
            self._answered &= keys.keys()
            for gone in self._steps.keys() - keys.keys():
                del self._steps[gone]
            late = {keys[k]: status for k, status in self._late.items() if k in keys}
            self._late.clear()
            quiet = set(self._quiet)
            known = set(self._answered)
        ask = [(k not in known, pid) for k, pid in keys.items() if k not in quiet]
        ask = dict((pid, sockets[pid]) for _, pid in sorted(ask)[:MAX_AT_ONCE])
        answers, silent = ask_all(ask, self.deadline)
        now = time.monotonic()
        with self._lock:
            self._answered |= {_key(pid, sockets[pid][0]) for pid in answers}
            for pid in silent:
                self._quiet[_key(pid, sockets[pid][0])] = _Quiet(due=now)
            due = {key: q for key, q in self._quiet.items() if q.due <= now and not q.asking}
            start = bool(due) and not self._retrying
            if start:
                self._retrying = True
                for q in due.values():
                    q.asking = True
        if start:
            retry = {pid: sockets[pid] for pid, _ in due}
            threading.Thread(target=self._retry, args=(retry,), name="gputop-agent-retry",
                             daemon=True).start()
        for pid, status in late.items():
            answers.setdefault(pid, status)
        return {pid: self._checked(_key(pid, sockets[pid][0]), status)
                for pid, status in answers.items()}

    def _checked(self, key: _Key, status: dict[str, Any]) -> AgentStatus:
        """The one place an agent's reply is checked (``agent_status``): what is out of range
        is dropped and named in ``rejected``, never shown or exported."""
        parsed = parse_status(status, self._steps.get(key))
        if parsed.steps is not None:
            self._steps[key] = parsed.steps
        return parsed

    def _retry(self, sockets: Sockets) -> None:
        """Off the sampling thread: ask the quiet sockets again, with more patience."""
        try:
            answers, silent = ask_all(sockets, self.retry_timeout)
        except Exception:  # pragma: no cover - ask_all does not raise; never kill sampling
            answers, silent = {}, set(sockets)
        now = time.monotonic()
        with self._lock:
            self._retrying = False
            for pid, (path, _) in sockets.items():
                key = _key(pid, path)
                q = self._quiet.get(key)
                if q is None:
                    continue
                q.asking = False
                if pid in silent:
                    q.misses += 1
                    q.due = now + min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (q.misses - 1))
                    continue
                del self._quiet[key]  # it answers again (perhaps with an error: not quiet)
                if pid in answers:
                    self._late[key] = answers[pid]
                    self._answered.add(key)
