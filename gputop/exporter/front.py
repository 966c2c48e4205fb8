"""The exporter's plain-HTTP front: one thread and a selector for every connection.

A thread per connection cost a thread start per scrape and, with 20 clients scraping back to
back, 20 threads taking turns at the interpreter lock: a well-behaved scraper waited behind
them (``benchmarks/bench_exporter_load.py``: p95 0.046 s beside them, 0.010 s alone). Here one
thread reads every connection's request as its bytes arrive (a slow-loris client costs a
buffer, not a thread), answers a scrape at once from the bytes rendered after the last tick,
and hands what must be rendered for the request (a ``name[]`` filter, a format nobody asked
for before) to a few worker threads, whose answers come back to the loop to be written.

The bounds are the threaded server's: at most ``MAX_CONNECTIONS`` at once (one more is closed
unread), the request line and headers within ``HEADER_DEADLINE_S`` of connecting (or the
connection is closed), the answer taken by the client within ``REQUEST_TIMEOUT_S``, a request
line of at most 64 KiB (414) and headers of at most 64 KiB (431). One request per connection,
as before (``Connection: close``). TLS is served by the threaded server (``server.serve``).
"""

from __future__ import annotations

import io
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from urllib.parse import unquote

from gputop.exporter.connections import CHECK_EVERY_S, HEADER_DEADLINE_S, MAX_CONNECTIONS

MAX_REQUEST_LINE = 65536
MAX_HEADERS = 65536
READ_CHUNK = 65536
RENDER_WORKERS = 2
ACCEPT_BATCH = 64  # connections taken per wake-up of the listening socket
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset
WAKE = "wake"  # the selector data of the workers' wake-up socket
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           414: "URI Too Long", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error"}

# (environ, start_response) -> the body's parts, or None when it must be rendered first (in a
# worker, by the second callable)
Answer = Callable[[dict, Callable], "list[bytes] | None"]


class _Connection:
    __slots__ = ("sock", "address", "inbox", "outbox", "sent", "due", "waiting", "events")

    def __init__(self, sock: socket.socket, address: tuple, due: float) -> None:
        self.sock, self.address, self.due = sock, address, due
        self.inbox = bytearray()
        self.outbox: memoryview | None = None
        self.sent = 0
        self.waiting = False  # its answer is being rendered by a worker
        self.events = 0  # what the selector watches it for (0: not registered)


_date: list = [0, ""]  # the Date header's second and text (formatted once a second)


def _http_date() -> str:
    now = int(time.time())
    if _date[0] != now:
        _date[:] = [now, formatdate(now, usegmt=True)]
    return _date[1]


def _response(status: str, headers: list[tuple[str, str]], body: bytes,
              head_only: bool) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Date: {_http_date()}",
             "Server: gputop-exporter", "Connection: close"]
    names = {name.lower() for name, _ in headers}
    lines += [f"{name}: {value}" for name, value in headers]
    if "content-length" not in names:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def _error(code: int, text: str) -> bytes:
    body = f"{code} {REASONS[code]}: {text}\n".encode()
    return _response(f"{code} {REASONS[code]}", [("Content-Type", "text/plain")], body, False)


class RequestError(ValueError):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


def parse_request(head: bytes, address: tuple, port: int) -> dict:
    """The WSGI environ of a request's line and headers (``head``, without the blank line)."""
    text = head.decode("latin-1")
    line, _, rest = text.partition("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/") or not parts[0].isalpha():
        raise RequestError(400, "not an HTTP request line")
    method, target, version = parts
    path, _, query = target.partition("?")
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": unquote(path, "latin-1"),
        "QUERY_STRING": query, "SERVER_PROTOCOL": version, "SCRIPT_NAME": "",
        "SERVER_NAME": "gputop-exporter", "SERVER_PORT": str(port),
        "REMOTE_ADDR": str(address[0]) if address else "", "CONTENT_TYPE": "",
        "CONTENT_LENGTH": "", "wsgi.version": (1, 0), "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr, "wsgi.multithread": True,
        "wsgi.multiprocess": False, "wsgi.run_once": False,
    }
    for header in rest.split("\r\n") if rest else ():
        name, sep, value = header.partition(":")
        if not sep or not name or name != name.strip():
            raise RequestError(400, "a malformed header line")
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            environ[key] = value.strip()
        else:
            key = "HTTP_" + key
            value = value.strip()
            environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def _answer_bytes(app: Callable, environ: dict) -> bytes | None:
    """Run ``app`` (a WSGI app, or one that returns None for "not now") into response bytes."""
    started: list = []

    def start_response(status: str, headers: list, exc_info=None) -> Callable:
        started[:] = [status, headers]
        return lambda data: None

    parts = app(environ, start_response)
    if parts is None:
        return None
    try:
        body = b"".join(parts)
    finally:
        close = getattr(parts, "close", None)
        if close is not None:
            close()
    return _response(started[0], started[1], body, environ["REQUEST_METHOD"] == "HEAD")


class SelectorFront:
    """Serve ``answer_now`` (fast, in the loop) and ``answer`` (in a worker) on one listening
    socket; ``serve_forever`` in a thread, ``shutdown`` and ``server_close`` to stop."""

    def __init__(self, listener: socket.socket, answer_now: Answer, answer: Callable,
                 header_deadline_s: float = HEADER_DEADLINE_S,
                 request_timeout_s: float = 10.0, max_connections: int = MAX_CONNECTIONS,
                 ) -> None:
        self.socket = listener
        self.server_port = listener.getsockname()[1]
        self._answer_now, self._answer = answer_now, answer
        self.header_deadline_s, self.request_timeout_s = header_deadline_s, request_timeout_s
        self.max_connections = max_connections
        listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, WAKE)
        self._connections: dict[int, _Connection] = {}
        self._rendered: deque[tuple[_Connection, bytes]] = deque()
        self._workers = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="exporter-render")
        self._stop = threading.Event()
        self._stopped = threading.Event()

    # The loop

    def serve_forever(self) -> None:
        try:
            next_check = time.monotonic() + CHECK_EVERY_S
            while not self._stop.is_set():
                for key, mask in self._selector.select(CHECK_EVERY_S):
                    if key.data is None:
                        self._accept()
                    elif key.data is WAKE:
                        self._take_rendered()
                    elif mask & selectors.EVENT_READ:
                        self._read(key.data)
                    elif mask & selectors.EVENT_WRITE:
                        self._write(key.data)
                now = time.monotonic()
                if now >= next_check:
                    self._expire(now)
                    next_check = now + CHECK_EVERY_S
        finally:
            for conn in list(self._connections.values()):
                self._close(conn)
            self._stopped.set()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # a connection reset before it was taken, out of descriptors: go on
            if len(self._connections) >= self.max_connections:
                sock.close()  # as many served as may be: this one is closed, unread
                continue
            sock.setblocking(False)
            conn = _Connection(sock, address, time.monotonic() + self.header_deadline_s)
            self._connections[sock.fileno()] = conn
            # The request is most often in already: read and answer it now, and the
            # connection is never registered with the selector (two system calls fewer).
            self._read(conn)

    def _watch(self, conn: _Connection, events: int) -> None:
        if events == conn.events:
            return
        if not events:
            self._selector.unregister(conn.sock)
        elif not conn.events:
            self._selector.register(conn.sock, events, conn)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _read(self, conn: _Connection) -> None:
        try:
            chunk = conn.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            self._watch(conn, selectors.EVENT_READ)
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(conn)
            return
        conn.inbox += chunk
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            line_end = conn.inbox.find(b"\r\n")
            if line_end < 0 and len(conn.inbox) > MAX_REQUEST_LINE:
                self._reply(conn, _error(414, "the request line is over 64 KiB"))
            elif len(conn.inbox) > MAX_REQUEST_LINE + MAX_HEADERS:
                self._reply(conn, _error(431, "the headers are over 64 KiB"))
            else:
                self._watch(conn, selectors.EVENT_READ)  # the rest of the request
            return
        head = bytes(conn.inbox[:end])
        line_end = head.find(b"\r\n")
        if (line_end if line_end >= 0 else len(head)) > MAX_REQUEST_LINE:
            self._reply(conn, _error(414, "the request line is over 64 KiB"))
            return
        try:
            environ = parse_request(head, conn.address, self.server_port)
        except RequestError as exc:
            self._reply(conn, _error(exc.code, str(exc)))
            return
        try:
            answer = _answer_bytes(self._answer_now, environ)
        except Exception as exc:  # a defect: one line, the client gets a 500
            self._failed(conn, exc)
            return
        if answer is not None:
            self._reply(conn, answer)
            return
        conn.waiting = True  # rendered for it in a worker; nothing more is read from it
        conn.due = time.monotonic() + self.request_timeout_s
        self._watch(conn, 0)
        self._workers.submit(self._render, conn, environ)

    def _render(self, conn: _Connection, environ: dict) -> None:
        try:
            answer = _answer_bytes(self._answer, environ) or _error(500, "no answer")
        except Exception as exc:
            print(f"gputop exporter: error answering a request: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            answer = _error(500, "the exporter failed to render the metrics")
        self._rendered.append((conn, answer))
        try:
            self._wake_write.send(b"\0")
        except OSError:
            pass  # the wake-up pipe is full: the loop wakes anyway

    def _take_rendered(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._rendered:
            conn, answer = self._rendered.popleft()
            if self._connections.get(conn.sock.fileno()) is conn:
                conn.waiting = False
                self._reply(conn, answer)

    def _failed(self, conn: _Connection, exc: Exception) -> None:
        print(f"gputop exporter: error answering a request: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        self._reply(conn, _error(500, "the exporter failed to answer"))

    def _reply(self, conn: _Connection, answer: bytes) -> None:
        conn.outbox, conn.sent = memoryview(answer), 0
        conn.due = time.monotonic() + self.request_timeout_s
        self._write(conn)
        if conn.outbox is not None:  # not all of it taken yet
            self._watch(conn, selectors.EVENT_WRITE)

    def _write(self, conn: _Connection) -> None:
        assert conn.outbox is not None
        try:
            while conn.sent < len(conn.outbox):
                conn.sent += conn.sock.send(conn.outbox[conn.sent:])
        except (BlockingIOError, InterruptedError):
            return  # the rest when the client has taken some
        except OSError:
            pass  # it went away mid-answer: nothing to report
        self._close(conn)

    def _expire(self, now: float) -> None:
        """Close the connections past their deadline: a request not in within
        ``header_deadline_s``, an answer not taken within ``request_timeout_s``."""
        for conn in [c for c in self._connections.values() if c.due <= now and not c.waiting]:
            self._close(conn, abort=True)

    def _close(self, conn: _Connection, abort: bool = False) -> None:
        """Close a connection: what was written reaches the client first, or, with ``abort``
        (past its deadline), nothing more is sent (a reset)."""
        fd = conn.sock.fileno()
        if self._connections.pop(fd, None) is None:
            return
        conn.outbox = None
        if conn.events:
            self._selector.unregister(conn.sock)
            conn.events = 0
        try:
            if abort:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            else:
                conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        conn.sock.close()

    # The server's interface (socketserver's names, as the threaded server has them)

    def shutdown(self) -> None:
        self._stop.set()
        try:
            self._wake_write.send(b"\0")
        except OSError:
            pass
        self._stopped.wait(5.0)

    def server_close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._selector.close()
        self.socket.close()
        self._wake_read.close()
        self._wake_write.close()
