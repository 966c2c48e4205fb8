"""The agent's per-process Unix socket server.

One daemon thread blocks in ``accept()`` (no cost while idle); each connection gets a short-lived
daemon thread, so a ``capture`` that waits for steps does not hold up ``status``. Every
connection is checked with SO_PEERCRED; requests are JSON lines of at most 64 KiB, and only the
allow-listed commands run. Any failure becomes an error reply; nothing raises out of here.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputop.agent.protocol import (
    COMMANDS,
    MAX_MESSAGE,
    encode,
    peer_allowed,
    peer_uid,
    pid_namespace,
    socket_dir,
    socket_name,
)

IDLE_TIMEOUT_S = 60.0  # a connection that sends nothing for this long is closed
MAX_CONNECTIONS = 16  # at once; more get a `busy` reply

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
        self._owner_pid = 0
        self.path: Path | None = None
        self.refused = 0  # connections from other users

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
        self._listener = listener
        self._owner_pid = pid
        self.path = final
        threading.Thread(target=self._serve, name="gputop-agent", daemon=True).start()
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
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
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
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.path = None

    # --- serving -------------------------------------------------------------------------------

    def _serve(self) -> None:
        listener = self._listener
        while listener is not None and self._listener is listener:
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._listener is not listener:
                    return  # closed
                continue
            except Exception as exc:  # pragma: no cover - defensive: keep serving
                self._on_error(exc)
                continue
            try:
                self._admit(conn)
            except Exception as exc:  # pragma: no cover - defensive
                self._on_error(exc)
                conn.close()

    def _admit(self, conn: socket.socket) -> None:
        try:
            uid = peer_uid(conn)
        except OSError:
            uid = -1
        if not peer_allowed(uid):
            # Another user: close at once. No reply, so nothing about the process leaks and
            # the accept loop spends no time on the peer.
            self.refused += 1
            conn.close()
            return
        if not self._slots.acquire(blocking=False):
            self._send_and_close(conn, _error("busy", "too many connections to this agent"))
            return
        self._conns.add(conn)
        try:
            threading.Thread(
                target=self._connection, args=(conn,), name="gputop-agent-conn", daemon=True
            ).start()
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

    def _connection(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IDLE_TIMEOUT_S)
            buffer = b""
            while True:
                newline = buffer.find(b"\n")
                if newline < 0:
                    if len(buffer) >= MAX_MESSAGE:
                        self._refuse_oversized(conn)
                        return
                    chunk = conn.recv(MAX_MESSAGE)
                    if not chunk:
                        return
                    buffer += chunk
                    continue
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
            pass  # the peer went away or idled out
        except Exception as exc:  # pragma: no cover - defensive
            self._on_error(exc)
        finally:
            self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass
            self._slots.release()

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
        from gputop.agent.protocol import decode

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
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
