"""One HTTP GET to an untrusted Prometheus server, over http.client (not urllib), so that:

* credentials go only to the URL's own origin (scheme, host, port): a redirect to another
  origin is refused with one line, never followed with the ``Authorization`` header (urllib's
  redirect handler copies every header to wherever the server points);
* one deadline bounds the whole exchange (connect, headers, body): a watchdog shuts the socket
  down when it passes, so a server that drips its answer a byte at a time cannot stretch it
  (a socket timeout bounds one read only);
* the body is bounded while it is read: past ``max_bytes``, or past ``max_series`` series
  (counted as the bytes stream by, before any decoding), the answer is refused at once.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

CHUNK = 256 * 1024
MAX_REDIRECTS = 3
MAX_ERROR_BODY = 64 * 1024
# Each series of a vector or matrix answer opens with this (a label value holding it is
# escaped as {\"metric\": inside its string, so it never matches there).
SERIES_MARK = b'{"metric":'


class TransportError(Exception):
    """One line, no secret in it (the caller prefixes the server's redacted URL)."""


class HttpStatus(TransportError):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_series: int | None = None
    what: str = "the answer"  # names the query in a refusal


def origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def shown_origin(url: str) -> str:
    scheme, host, port = origin(url)
    return f"{scheme}://{host}:{port}"


class _Watchdog:
    """Shuts the connection's socket down at the deadline: whatever read is blocked returns."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        # The socket itself: http.client drops its own reference once the response owns it.
        self.sock = sock
        self.fired = False
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


def get(url: str, headers: dict[str, str], deadline: float, limits: Limits,
        context: ssl.SSLContext | None, counter=None) -> bytes:
    """The body of a 200 answer to GET ``url`` (redirects within the same origin followed, at
    most MAX_REDIRECTS); TransportError otherwise. ``counter(n)`` is told of each n bytes read."""
    home = origin(url)
    for _ in range(MAX_REDIRECTS + 1):
        status, location, body = _once(url, headers, deadline, limits, context, counter)
        if location is None:
            if status != 200:
                raise HttpStatus(status, body)
            return body
        target = urllib.parse.urljoin(url, location)
        if origin(target) != home:
            raise TransportError(
                f"redirected (HTTP {status}) to another host, {shown_origin(target)}: refused "
                "(credentials go only to the --prometheus URL's own host; give that URL instead)")
        url = target
    raise TransportError(f"more than {MAX_REDIRECTS} redirects: refused")


def _once(url: str, headers: dict[str, str], deadline: float, limits: Limits,
          context: ssl.SSLContext | None, counter) -> tuple[int, str | None, bytes]:
    parts = urllib.parse.urlsplit(url)
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    host, port = parts.hostname or "", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=left, context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=left)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    dog: _Watchdog | None = None
    try:
        try:
            conn.connect()  # bounded by the socket timeout (what is left)
            if conn.sock is None:
                raise OSError("no connection")
            dog = _Watchdog(conn.sock, deadline)
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
            answer: tuple[int, str | None, bytes]
            if response.status in (301, 302, 303, 307, 308):
                answer = response.status, response.getheader("Location") or "", b""
            elif response.status != 200:
                answer = response.status, None, response.read(MAX_ERROR_BODY)
            else:
                answer = 200, None, _body(response, limits, counter)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if (dog is not None and dog.fired) or isinstance(exc, TimeoutError):
                raise TimeoutError from None
            raise
        if dog.fired:  # cut short at the deadline: what was read is not the answer
            raise TimeoutError
        return answer
    finally:
        if dog is not None:
            dog.cancel()
        conn.close()


def _body(response: http.client.HTTPResponse, limits: Limits, counter) -> bytes:
    pieces: list[bytes] = []
    size = series = 0
    tail = b""
    keep = len(SERIES_MARK) - 1
    while True:
        piece = response.read1(CHUNK) if hasattr(response, "read1") else response.read(CHUNK)
        if not piece:
            break
        size += len(piece)
        if counter is not None:
            counter(len(piece))
        if size > limits.max_bytes:
            bound = (f"{limits.max_bytes / 2**20:g} MiB" if limits.max_bytes >= 2**20
                     else f"{limits.max_bytes} bytes")
            raise TransportError(f"{limits.what}: over {bound}, refused "
                                 "while reading (narrow it with --namespace, --label, ...)")
        if limits.max_series is not None:
            window = tail + piece
            series += window.count(SERIES_MARK)
            tail = window[-keep:]
            if series > limits.max_series:
                raise TransportError(
                    f"{limits.what}: over {limits.max_series} series, refused while reading "
                    "(narrow it with --namespace, --label, ... or raise --prom-max-series)")
        pieces.append(piece)
    return b"".join(pieces)
