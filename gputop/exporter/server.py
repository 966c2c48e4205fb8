"""The exporter's HTTP side: prometheus-client's WSGI app on a threading server, optionally
behind TLS (with client certificates) and HTTP basic auth.

prometheus-client's ``start_http_server`` has TLS but no basic auth, and no way to put a
check in front of its app before it starts serving; so this module serves the same
``make_wsgi_app`` (content negotiation, OpenMetrics, gzip) on the same ``ThreadingWSGIServer``,
with the auth check in front. The TLS handshake runs in the request's own thread, with a
timeout, so a client that connects and says nothing holds up nobody else (prometheus-client's
server does the handshake in its accept loop).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import ssl
import stat
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry

from gputop.errors import UsageError

REQUEST_TIMEOUT_S = 10.0
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


def metrics_app(registry: CollectorRegistry, auth: BasicAuth | None):
    exposition = make_wsgi_app(registry)

    def app(environ, start_response):
        if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION")):
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
        return exposition(environ, start_response)

    return app


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # a client that stalls is dropped, not waited on forever

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in this request's thread
        super().setup()

    def log_message(self, format: str, *args) -> None:
        pass  # no line per scrape


class _Server(ThreadingWSGIServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away or failed the handshake: nothing to report


def serve(registry: CollectorRegistry, listen: Listen, context: ssl.SSLContext | None,
          auth: BasicAuth | None) -> tuple[_Server, threading.Thread]:
    """Bind and serve in a daemon thread; ``server.shutdown()`` stops it."""
    import socket

    try:
        infos = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--listen: cannot resolve {listen.host}: {exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]

    class Server(_Server):
        address_family = family

    try:
        server = make_server(sockaddr[0], listen.port, metrics_app(registry, auth), Server,
                             handler_class=_Handler)
    except OSError as exc:
        raise UsageError(f"cannot listen on {listen.url_host}:{listen.port}: "
                         f"{exc.strerror or exc}", exit_code=1) from None
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, name="exporter-http", daemon=True)
    thread.start()
    return server, thread
