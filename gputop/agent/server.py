"""The agent's per-process Unix socket server.

One daemon thread waits on the listening socket and on every connection that has not yet sent
a whole request (a poll; no cost while idle). A request counts only once its line is complete:
then it runs on a short-lived daemon thread (at most ``MAX_CONNECTIONS`` at once; more get a
``busy`` reply), so a ``capture`` that waits for steps does not hold up ``status``, and a
client that sends slowly holds no slot. Each request must arrive whole within
``REQUEST_TIMEOUT_S`` of the connection being ready for it, whatever the gaps between its bytes
(a slow-loris sending a byte every 2 s is cut off after 5 s); at most ``MAX_PENDING``
connections wait for their request, the oldest is dropped beyond that. Every connection is
checked with SO_PEERCRED; requests are JSON lines of at most 64 KiB, and only the allow-listed
commands run. Any failure becomes an error reply; nothing raises out of here.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputop.core.protocol import (
    COMMANDS,
    MAX_MESSAGE,
    encode,
    peer_allowed,
    peer_uid,
    pid_namespace,
    socket_dir,
    socket_name,
)

REQUEST_TIMEOUT_S = 5.0  # a request arrives whole within this, or its connection is closed
MAX_CONNECTIONS = 16  # requests being handled at once; more get a `busy` reply
MAX_PENDING = 64  # connections waiting for a whole request; beyond, the oldest is closed

# handler(message, client_gone) -> reply
Handler = Callable[[dict[str, Any], Callable[[], bool]], dict[str, Any]]


def _error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "message": message}


def _reply_bytes(reply: dict[str, Any]) -> bytes:
    message = reply.get("message")
    if isinstance(message, str) and not message.isprintable():
        # Error messages are one line for the user, whatever the request echoed.
        reply = {**reply, "message": "".join(c if c.isprintable() else " " for c in message)}
    try:
        return encode(reply)
    except (TypeError, ValueError) as exc:
        return encode(_error("internal", f"reply could not be encoded: {exc}"[:200]))


@dataclass
class _Waiting:
    """A connection whose next request is not whole yet: read on the serving thread only."""

    conn: socket.socket
    deadline: float  # time.monotonic() by which the request must be whole
    buffer: bytes = b""
    since: float = field(default_factory=time.monotonic)


class AgentServer:
    def __init__(self, handlers: dict[str, Handler], on_error: Callable[[BaseException], None]):
        unknown = set(handlers) - set(COMMANDS)
        if unknown:
            raise ValueError(f"not in the protocol's allow-list: {sorted(unknown)}")
        self._handlers = handlers
        self._on_error = on_error
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._wake: tuple[int, int] | None = None  # a pipe: handed-back connections, close()
        self._returned: deque[tuple[socket.socket, bytes]] = deque()
        self._owner_pid = 0
        self.path: Path | None = None
        self.refused = 0  # connections from other users
        self.dropped = 0  # connections closed before their request was whole

    def start(self) -> Path:
        """Bind ``<socket dir>/<pid>.sock`` (0600; ``<pid>-ns<inode>.sock`` in a container's
        pid namespace) and start serving; raises on failure."""
        directory = socket_dir(create=True)
        pid = os.getpid()
        final = directory / socket_name(pid, pid_namespace())
        staging = directory / f".{pid}.{threading.get_ident()}.tmp"
        for stale in (staging, final):
            try:
                os.unlink(stale)  # a socket of a dead process that had our pid
            except FileNotFoundError:
                pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(str(staging))
            os.chmod(staging, 0o600)
            listener.listen(MAX_CONNECTIONS)
            listener.setblocking(False)
            # The final name appears only once we listen: a client that finds the name but
            # gets "connection refused" may then safely treat it as stale.
            os.rename(staging, final)
        except BaseException:
            listener.close()
            try:
                os.unlink(staging)
            except OSError:
                pass
            raise
        self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._listener = listener
        self._owner_pid = pid
        self.path = final
        threading.Thread(target=self._serve, args=(listener, self._wake[0]),
                         name="gputop-agent", daemon=True).start()
        return final

    def close(self) -> None:
        """Stop serving and remove our socket file (only ever in the process that made it)."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        if self.path is not None and os.getpid() == self._owner_pid:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        self._poke()  # the serving thread sees the listener gone, closes what waits, and ends
        listener.close()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's sockets without touching the parent's file.

        Only fd-level work here (no locks): other threads of the parent do not exist in the
        child and may have held any lock at the moment of the fork.
        """
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for conn in list(self._conns):
            try:
                conn.close()
            except OSError:
                pass
        self._conns = set()
        wake, self._wake = self._wake, None
        for fd in wake or ():
            try:
                os.close(fd)
            except OSError:
                pass
        self._returned = deque()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.path = None

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None:
            try:
                os.write(wake[1], b"x")
            except OSError:
                pass  # full: the thread wakes anyway

    # --- serving: one thread reads requests until they are whole --------------------------------

    def _serve(self, listener: socket.socket, wake: int) -> None:
        waiting: dict[socket.socket, _Waiting] = {}
        # poll, not epoll: no descriptor of its own to leak into a forked child.
        with selectors.PollSelector() as selector:
            try:
                selector.register(listener, selectors.EVENT_READ)
                selector.register(wake, selectors.EVENT_READ)
                while self._listener is listener:
                    now = time.monotonic()
                    timeout = min((w.deadline for w in waiting.values()), default=now + 3600)
                    for key, _ in selector.select(max(0.0, timeout - now)):
                        if self._listener is not listener:
                            break
                        if key.fileobj is listener:
                            self._accept(listener, selector, waiting)
                        elif key.fileobj == wake:
                            self._take_returned(wake, selector, waiting)
                        elif key.fileobj in waiting:  # not dropped earlier in this round
                            self._read(waiting[key.fileobj], selector, waiting)
                    self._expire(selector, waiting)
            except Exception as exc:  # pragma: no cover - defensive: say why we stopped
                self._on_error(exc)
            finally:
                # The wake pipe stays open: a handler thread may still write to it.
                for conn in list(waiting):
                    self._drop(conn, selector, waiting)

    def _accept(self, listener: socket.socket, selector: selectors.BaseSelector,
                waiting: dict[socket.socket, _Waiting]) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return  # closed meanwhile, or out of descriptors: the next accept may work
        try:
            uid = peer_uid(conn)
        except OSError:
            uid = -1
        if not peer_allowed(uid):
            # Another user: close at once. No reply, so nothing about the process leaks and
            # the serving thread spends no time on the peer.
            self.refused += 1
            conn.close()
            return
        self._wait_for_request(conn, b"", selector, waiting)

    def _wait_for_request(self, conn: socket.socket, buffer: bytes,
                          selector: selectors.BaseSelector,
                          waiting: dict[socket.socket, _Waiting]) -> None:
        if len(waiting) >= MAX_PENDING:  # the one that has waited longest makes room
            self._drop(min(waiting.values(), key=lambda w: w.since).conn, selector, waiting)
        conn.setblocking(False)
        waiting[conn] = _Waiting(conn, time.monotonic() + REQUEST_TIMEOUT_S, buffer)
        self._conns.add(conn)
        selector.register(conn, selectors.EVENT_READ)
        if b"\n" in buffer or len(buffer) >= MAX_MESSAGE:
            self._handle(waiting[conn], selector, waiting)

    def _take_returned(self, wake: int, selector: selectors.BaseSelector,
                       waiting: dict[socket.socket, _Waiting]) -> None:
        try:
            os.read(wake, 4096)
        except OSError:
            pass
        while self._returned:
            conn, buffer = self._returned.popleft()
            self._wait_for_request(conn, buffer, selector, waiting)

    def _read(self, entry: _Waiting, selector: selectors.BaseSelector,
              waiting: dict[socket.socket, _Waiting]) -> None:
        try:
            chunk = entry.conn.recv(MAX_MESSAGE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(entry.conn, selector, waiting, counted=False)
            return
        entry.buffer += chunk
        if b"\n" in chunk or len(entry.buffer) >= MAX_MESSAGE:
            self._handle(entry, selector, waiting)

    def _expire(self, selector: selectors.BaseSelector,
                waiting: dict[socket.socket, _Waiting]) -> None:
        now = time.monotonic()
        for entry in [w for w in waiting.values() if w.deadline <= now]:
            self._drop(entry.conn, selector, waiting)

    def _drop(self, conn: socket.socket, selector: selectors.BaseSelector,
              waiting: dict[socket.socket, _Waiting], counted: bool = True) -> None:
        waiting.pop(conn, None)
        self._conns.discard(conn)
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
        self.dropped += counted

    def _handle(self, entry: _Waiting, selector: selectors.BaseSelector,
                waiting: dict[socket.socket, _Waiting]) -> None:
        """A whole request (or an oversized one): off to a thread of its own, or `busy`."""
        conn = entry.conn
        waiting.pop(conn, None)
        selector.unregister(conn)
        conn.settimeout(REQUEST_TIMEOUT_S)  # blocking again, for the replies
        if not self._slots.acquire(blocking=False):
            self._conns.discard(conn)
            self._send_and_close(conn, _error("busy", "too many connections to this agent"))
            return
        try:
            threading.Thread(target=self._connection, args=(conn, entry.buffer),
                             name="gputop-agent-conn", daemon=True).start()
        except BaseException:
            self._conns.discard(conn)
            self._slots.release()
            conn.close()
            raise

    @staticmethod
    def _send_and_close(conn: socket.socket, reply: dict[str, Any]) -> None:
        try:
            conn.settimeout(0.5)
            conn.sendall(_reply_bytes(reply))
        except OSError:
            pass
        finally:
            conn.close()

    # --- handling: a thread per whole request ----------------------------------------------

    def _connection(self, conn: socket.socket, buffer: bytes) -> None:
        """Answer every whole request in ``buffer``, then hand the connection back to the
        serving thread for the next one."""
        keep = False
        try:
            while True:
                newline = buffer.find(b"\n")
                if newline < 0:
                    if len(buffer) >= MAX_MESSAGE:
                        self._refuse_oversized(conn)
                        return
                    keep = True
                    return
                line, buffer = buffer[:newline], buffer[newline + 1 :]
                if len(line) + 1 > MAX_MESSAGE:
                    self._refuse_oversized(conn)
                    return
                reply = self._dispatch(line, lambda: _peer_gone(conn))
                # A handler may ask to know when its reply has left (a capture finished in a
                # process that is about to die waits for that).
                sent = reply.pop("_sent", None) if isinstance(reply, dict) else None
                conn.sendall(_reply_bytes(reply))
                if sent is not None:
                    sent.set()
        except OSError:
            pass  # the peer went away or stopped reading our replies
        except Exception as exc:  # pragma: no cover - defensive
            self._on_error(exc)
        finally:
            self._slots.release()
            if keep and self._listener is not None:
                self._returned.append((conn, buffer))
                self._poke()
            else:
                self._conns.discard(conn)
                try:
                    conn.close()
                except OSError:
                    pass

    @staticmethod
    def _refuse_oversized(conn: socket.socket) -> None:
        """Say why, then drain a little before closing, so the reply is not lost to a reset."""
        conn.sendall(
            _reply_bytes(_error("too-large", f"messages are capped at {MAX_MESSAGE} bytes"))
        )
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(1.0)
        drained = 0
        while drained < 16 * MAX_MESSAGE:
            chunk = conn.recv(MAX_MESSAGE)
            if not chunk:
                break
            drained += len(chunk)

    def _dispatch(self, line: bytes, client_gone: Callable[[], bool]) -> dict[str, Any]:
        from gputop.core.protocol import decode

        try:
            message = decode(line.rstrip(b"\r"))
        except ValueError as exc:
            return _error("bad-request", str(exc))
        cmd = message.get("cmd")
        if not isinstance(cmd, str):
            return _error("bad-request", 'a request needs "cmd": one of ' + ", ".join(COMMANDS))
        handler = self._handlers.get(cmd)
        if handler is None:
            return _error(
                "unknown-command", f"unknown command {cmd[:40]!r}; known: {', '.join(COMMANDS)}"
            )
        try:
            reply = handler(message, client_gone)
        except Exception as exc:
            self._on_error(exc)
            return _error("internal", f"{cmd} failed: {type(exc).__name__}: {exc}"[:300])
        return reply


def _peer_gone(conn: socket.socket) -> bool:
    """True once the client has hung up (EOF pending); never consumes request bytes."""
    try:
        # Poll first: a socket with a timeout waits that long in recv, MSG_DONTWAIT or not
        # (and poll, unlike select, takes descriptors above 1023).
        poller = select.poll()
        poller.register(conn, select.POLLIN)
        if not poller.poll(0):
            return False
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):
        return True
