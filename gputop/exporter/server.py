"""The exporter's HTTP side: prometheus-client's WSGI app behind HTTP basic auth, served plain
by one thread for every connection (``gputop.exporter.front``) or behind TLS (with client
certificates) on a threading server.

prometheus-client's ``start_http_server`` has TLS but no basic auth, and no way to put a
check in front of its app before it starts serving; so this module serves the same
``make_wsgi_app`` (content negotiation, OpenMetrics, gzip, ``name[]`` filters) with the auth
check in front. Under TLS the handshake runs in the request's own thread, with a timeout, so a
client that connects and says nothing holds up nobody else (prometheus-client's server does the
handshake in its accept loop). A client that goes away mid-answer is no error (no traceback on
stderr), and an address that fails basic auth ``MAX_FAILED_LOGINS`` times within
``LOGIN_WINDOW_S`` is answered 429 until its failures age out, whatever it sends: a password
cannot be guessed at the speed of the network.

A scrape is served from the bytes the sampling thread rendered after its last tick
(``gputop.exporter.rendered``), and the connections are bounded in number and in the time
their request may take to arrive (``gputop.exporter.connections``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import math
import os
import socket
import ssl
import stat
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, gzip_accepted
from prometheus_client.registry import CollectorRegistry

from gputop.core.errors import UsageError
from gputop.exporter import DEFAULT_LISTEN  # noqa: F401 (re-exported)
from gputop.exporter.connections import ConnectionSlots, HeaderDeadlines
from gputop.exporter.front import SelectorFront
from gputop.exporter.rendered import RenderedExposition

REQUEST_TIMEOUT_S = 10.0
MAX_FAILED_LOGINS = 10  # per client address within LOGIN_WINDOW_S; more get 429
LOGIN_WINDOW_S = 60.0
MAX_TRACKED = 4096  # client addresses remembered; the least recent go first
LANDING = (b"<html><head><title>gputop exporter</title></head><body><h1>gputop exporter</h1>"
           b"<p><a href='/metrics'>/metrics</a></p></body></html>\n")


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_listen(text: str) -> Listen:
    """'HOST:PORT', '[V6]:PORT' or 'PORT' (on 127.0.0.1)."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise UsageError("--listen needs a host, e.g. 127.0.0.1:9835 (0.0.0.0:9835 for every "
                         "interface)")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--listen takes HOST:PORT, not {text!r}") from None
    if not 0 <= number <= 65535:
        raise UsageError(f"--listen: port {number} is out of range")
    return Listen(host, number)


class BasicAuth:
    """Users and passwords from a file of ``user:password`` lines. The file must be readable by
    its owner only (as ssh demands of a private key): a password file others can read is a
    mistake to report, not to serve with."""

    def __init__(self, path: str) -> None:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise UsageError(f"--basic-auth-file: cannot read {path}: "
                             f"{exc.strerror or exc}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"--basic-auth-file: {path} is readable by others; "
                             f"chmod 600 {path}")
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read(1 << 20).splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--basic-auth-file: cannot read {path}: {exc}") from None
        self.credentials: list[bytes] = []
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            user, sep, password = line.partition(":")
            if not sep or not user or not password:
                raise UsageError(f"--basic-auth-file: {path}:{number}: expected user:password")
            self.credentials.append(f"{user}:{password}".encode())
        if not self.credentials:
            raise UsageError(f"--basic-auth-file: {path} names no user")

    def allows(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            given = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        # Compare with every entry, always: the time taken says nothing about which matched.
        ok = False
        for expected in self.credentials:
            ok |= hmac.compare_digest(given, expected)
        return ok


class LoginLimiter:
    """Failed logins per client address in a sliding window. Thread-safe."""

    def __init__(self, limit: int = MAX_FAILED_LOGINS, window: float = LOGIN_WINDOW_S,
                 clock=time.monotonic) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, address: str, now: float) -> deque[float] | None:
        failures = self._failures.get(address)
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if failures is not None and not failures:
            del self._failures[address]
            return None
        return failures

    def locked_for(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: it may now)."""
        now = self.clock()
        with self._lock:
            failures = self._recent(address, now)
            if failures is None or len(failures) < self.limit:
                return 0.0
            return failures[-self.limit] + self.window - now

    def failed(self, address: str) -> bool:
        """Count a failure; True when it is the one that locks the address out."""
        now = self.clock()
        with self._lock:
            failures = self._recent(address, now)
            if failures is None:
                failures = self._failures[address] = deque(maxlen=self.limit)
                while len(self._failures) > MAX_TRACKED:
                    self._failures.popitem(last=False)
            failures.append(now)
            self._failures.move_to_end(address)
            return len(failures) == self.limit


def tls_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=cert, keyfile=key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--tls-cert/--tls-key: cannot load {cert} / {key}: {exc}") from None
    if client_ca:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--tls-client-ca: cannot load {client_ca}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def metrics_app(registry: CollectorRegistry, auth: BasicAuth | None,
                limiter: LoginLimiter | None = None,
                rendered: RenderedExposition | None = None):
    """The WSGI app; its ``now`` attribute answers the same, or returns None where the answer
    must be rendered first (a filtered scrape, a format not rendered yet) so that the caller
    can render it off its own thread (``gputop.exporter.front``)."""
    exposition = make_wsgi_app(registry)
    limiter = limiter or LoginLimiter()

    def answer(environ, start_response, render: bool = True):
        if auth is not None:
            address = environ.get("REMOTE_ADDR") or "?"
            wait = limiter.locked_for(address)
            if wait > 0:  # right or wrong, the password is not even looked at
                start_response("429 Too Many Requests",
                               [("Retry-After", str(math.ceil(wait))),
                                ("Content-Type", "text/plain")])
                return [b"429 Too Many Requests: too many failed logins\n"]
            if not auth.allows(environ.get("HTTP_AUTHORIZATION")):
                if limiter.failed(address):
                    print(f"gputop exporter: {limiter.limit} failed logins from {address} in "
                          f"{limiter.window:g} s; refusing it for a while", file=sys.stderr,
                          flush=True)
                start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="gputop"'),
                                                    ("Content-Type", "text/plain")])
                return [b"401 Unauthorized\n"]
        path = environ.get("PATH_INFO") or "/"
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html")])
            return [LANDING]
        if path != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"404 Not Found: the metrics are at /metrics\n"]
        if rendered is None or "name[]" in (environ.get("QUERY_STRING") or ""):
            if not render:
                return None
            return exposition(environ, start_response)  # a filtered scrape is rendered for it
        gzipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        content_type, body = rendered.body(environ.get("HTTP_ACCEPT"), gzipped, render)
        if body is None:
            return None
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    def app(environ, start_response):
        return answer(environ, start_response)

    app.now = lambda environ, start_response: answer(environ, start_response, render=False)
    return app


class _QuietServerHandler(ServerHandler):
    def log_exception(self, exc_info) -> None:
        """wsgiref prints a traceback for any error while answering; a client that went away
        (a reset, a TLS connection closed without close_notify: SSLEOFError) is none of ours,
        and anything else is one line."""
        exc = exc_info[1]
        if not isinstance(exc, OSError):
            print(f"gputop exporter: error answering a request: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # a client that stalls is dropped, not waited on forever

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        self.server.deadlines.watch(self.request)  # the handshake and the request, in time
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in this request's thread
        super().setup()

    def handle(self) -> None:
        """WSGIRequestHandler.handle with the quiet ServerHandler."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():  # an error reply was sent
            return
        self.server.deadlines.done(self.request)  # the request is in: answered at its pace
        handler = _QuietServerHandler(self.rfile, self.wfile, self.get_stderr(),
                                      self.get_environ(), multithread=False)
        handler.request_handler = self
        handler.run(self.server.get_app())

    def log_message(self, format: str, *args) -> None:
        pass  # no line per scrape

    def finish(self) -> None:
        self.server.deadlines.done(self.request)
        super().finish()


class _Server(ThreadingWSGIServer):
    deadlines: HeaderDeadlines
    slots: ConnectionSlots
    # The listen backlog (socketserver's is 5): a burst of connections beyond it has its SYNs
    # dropped, and the client's retry comes 1 s, then 3 s later.
    request_queue_size = 256

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away or failed the handshake: nothing to report

    def process_request(self, request, client_address) -> None:
        if not self.slots.take():  # as many served as may be: this one is closed, unread
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread was started: nobody else gives its slot back
            self.slots.give_back()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.deadlines.done(request)
            self.slots.give_back()

    def server_close(self) -> None:
        self.deadlines.stop()
        super().server_close()


def _listening(family: int, host: str, listen: Listen) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
        sock.bind((host, listen.port))
        sock.listen(_Server.request_queue_size)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {listen.url_host}:{listen.port}: "
                         f"{exc.strerror or exc}", exit_code=1) from None
    return sock


def serve(registry: CollectorRegistry, listen: Listen, context: ssl.SSLContext | None,
          auth: BasicAuth | None, rendered: RenderedExposition | None = None,
          ) -> tuple[_Server | SelectorFront, threading.Thread]:
    """Bind and serve in a daemon thread; ``server.shutdown()`` stops it. With ``rendered``,
    a scrape is answered from its bytes (``refresh`` it after each tick). Plain HTTP is served
    by one thread for every connection (``gputop.exporter.front``), TLS by a thread each."""

    try:
        infos = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--listen: cannot resolve {listen.host}: {exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    app = metrics_app(registry, auth, rendered=rendered)
    if context is None:
        front = SelectorFront(_listening(family, sockaddr[0], listen), app.now, app,
                              request_timeout_s=REQUEST_TIMEOUT_S)
        thread = threading.Thread(target=front.serve_forever, name="exporter-http",
                                  daemon=True)
        thread.start()
        return front, thread

    class Server(_Server):
        address_family = family
        deadlines = HeaderDeadlines()
        slots = ConnectionSlots()

    try:
        server = make_server(sockaddr[0], listen.port, app, Server, handler_class=_Handler)
    except OSError as exc:
        raise UsageError(f"cannot listen on {listen.url_host}:{listen.port}: "
                         f"{exc.strerror or exc}", exit_code=1) from None
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, name="exporter-http", daemon=True)
    thread.start()
    return server, thread
