"""The exporter's plain-HTTP front (``gputop.exporter.front``): one thread for every connection,
its bounds on slow and oversized clients, and the scrapes the real exporter answers through it
(plain, gzip, OpenMetrics, a ``name[]`` filter rendered off the loop, HEAD, 404)."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

from gputop.exporter.front import SelectorFront
from tests.conftest import REPO, SLOW, cli_env, wait_for

BODY = b"gputop_test_metric 1.0\n"


def _app(render_gate: threading.Event | None = None, big: bytes = b""):
    """A WSGI app: /fast is answered in the loop, /slow only by a worker (after the gate
    opens), /big is ``big``."""

    def answer(environ, start_response, now: bool):
        path = environ["PATH_INFO"]
        if path == "/slow" and now:
            return None
        if path == "/slow" and render_gate is not None:
            assert render_gate.wait(SLOW)
        body = big if path == "/big" else BODY + environ["PATH_INFO"].encode()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body]

    return (lambda e, s: answer(e, s, False)), (lambda e, s: answer(e, s, True))


@contextmanager
def front(**bounds):
    render_gate = bounds.pop("render_gate", None)
    app, now = _app(render_gate, bounds.pop("big", b""))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    server = SelectorFront(listener, now, app, **bounds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(SLOW)


def get(port: int, path: str = "/fast", method: str = "GET") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=SLOW) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return read_all(s)


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_a_request_is_answered_beside_slow_clients_that_never_finish():
    with front() as port:
        slow = [socket.create_connection(("127.0.0.1", port), timeout=SLOW) for _ in range(60)]
        try:
            for s in slow:
                s.sendall(b"GET /fast HTTP/1.1\r\nHo")  # never the end of the headers
            answer = get(port)
        finally:
            for s in slow:
                s.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(BODY + b"/fast")


def test_a_request_not_in_by_the_deadline_is_closed():
    with front(header_deadline_s=0.5) as port:
        # Timed from before the connection: the deadline runs from its accept, which comes
        # after, so a client descheduled on a busy host cannot make the close look early.
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=SLOW) as s:
            s.sendall(b"GET /fast HTTP/1.1\r\n")
            try:
                assert read_all(s) == b""  # closed, unanswered
            except ConnectionResetError:
                pass  # or reset: either way, no answer
            took = time.monotonic() - started
        assert get(port).endswith(BODY + b"/fast")  # the others are still served
    assert took >= 0.4, took


def test_oversized_and_malformed_requests_get_their_status():
    with front() as port:
        assert get(port, "/" + "a" * 70000).startswith(b"HTTP/1.1 414 ")
        with socket.create_connection(("127.0.0.1", port), timeout=SLOW) as s:
            s.sendall(b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"b" * 140000 + b"\r\n")
            assert read_all(s).startswith(b"HTTP/1.1 431 ")
        with socket.create_connection(("127.0.0.1", port), timeout=SLOW) as s:
            s.sendall(b"\x16\x03\x01 hello\r\n\r\n")  # a TLS hello at a plain port, say
            assert read_all(s).startswith(b"HTTP/1.1 400 ")
        with socket.create_connection(("127.0.0.1", port), timeout=SLOW) as s:
            s.sendall(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")
            assert read_all(s).startswith(b"HTTP/1.1 400 ")


def closed_unread(port: int) -> bool:
    try:
        return get(port) == b""
    except (ConnectionResetError, BrokenPipeError):  # it was closed with our request unread
        return True


def answered(port: int) -> bool:
    try:
        return get(port).endswith(BODY + b"/fast")
    except ConnectionError:  # closed unread: the front had not yet seen the others close
        return False


def test_connections_over_the_limit_are_closed_unread():
    with front(max_connections=4) as port:
        held = [socket.create_connection(("127.0.0.1", port), timeout=SLOW) for _ in range(4)]
        try:
            for s in held:
                s.sendall(b"GET")
            # The fifth: closed by the front, whatever it sends.
            wait_for(lambda: closed_unread(port), timeout=SLOW, interval=0.1)
        finally:
            for s in held:
                s.close()
        wait_for(lambda: answered(port), timeout=SLOW, interval=0.1)


def test_what_must_be_rendered_is_rendered_off_the_loop():
    """A request whose answer is rendered by a worker holds up nobody: while it waits, another
    is answered; then it gets its own answer."""
    gate = threading.Event()
    with front(render_gate=gate) as port:
        result: list[bytes] = []
        waiting = threading.Thread(target=lambda: result.append(get(port, "/slow")))
        waiting.start()
        try:
            assert get(port).endswith(BODY + b"/fast")
            assert not result  # still waiting on its worker
        finally:
            gate.set()
        waiting.join(SLOW)
    assert result and result[0].endswith(BODY + b"/slow")


def test_head_has_the_length_and_no_body_and_a_client_that_never_reads_is_dropped():
    big = b"x" * (64 << 20)  # more than the kernel's buffers on both sides hold
    with front(big=big, request_timeout_s=1.0) as port:
        head = get(port, "/big", "HEAD")
        assert head.endswith(b"\r\n\r\n") and f"Content-Length: {len(big)}".encode() in head
        with socket.create_connection(("127.0.0.1", port), timeout=SLOW) as s:
            s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(2.5)  # not reading: the answer is not taken within 1 s
            got = b""
            try:
                got = read_all(s)
            except ConnectionResetError:
                pass  # dropped: what was not read yet is gone
        assert len(got) < len(big)  # dropped before all of it was sent
        assert get(port).endswith(BODY + b"/fast")


def test_the_real_exporter_answers_plain_gzip_openmetrics_filtered_and_404(spawn, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    errors = tmp_path / "stderr"
    spawn([sys.executable, "-m", "gputop", "--demo", "tour", "exporter", "--listen",
           f"127.0.0.1:{port}"], env=cli_env(), cwd=REPO, stdout=subprocess.DEVNULL,
          stderr=errors.open("wb"))
    wait_for(lambda: "/metrics (sampling every" in errors.read_text(), timeout=SLOW)
    url = f"http://127.0.0.1:{port}/metrics"

    def fetch(path: str = "", **headers: str):
        request = urllib.request.Request(url + path, headers=headers)
        with urllib.request.urlopen(request, timeout=SLOW) as response:
            return dict(response.headers), response.read()

    headers, plain = fetch()
    assert b"gputop_gpu_utilization_percent{" in plain
    assert headers["Content-Length"] == str(len(plain))
    headers, zipped = fetch(**{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"gputop_gpu_utilization_percent{" in gzip.decompress(zipped)
    headers, open_metrics = fetch(Accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert open_metrics.rstrip().endswith(b"# EOF")
    _, filtered = fetch("?name[]=gputop_gpu_utilization_percent")
    names = {line.split(b"{")[0] for line in filtered.splitlines() if not line.startswith(b"#")}
    assert names == {b"gputop_gpu_utilization_percent"}, names
    try:
        fetch("/../nothing")
        raise AssertionError("a 404 was expected")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
    assert "Traceback" not in errors.read_text()
