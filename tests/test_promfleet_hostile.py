"""A Prometheus server that fights back, on 127.0.0.x (real HTTP servers in the test, the real
client and the real `gputop watch`): a redirect to another host gets no credentials, a server
that drips its answer is cut at one deadline for the whole query, an answer past the series
bound is refused while it is still arriving."""

from __future__ import annotations

import json
import socket
import socketserver
import subprocess
import sys
import threading
import time

import pytest

from gputop.fleet.prometheus.client import PromAuth, PromClient, PromError
from tests.conftest import REPO, SLOW, cli_env

pytestmark = pytest.mark.timeout(4 * SLOW)


def _loopback(host: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


class Server:
    """A raw HTTP server: ``reply(request_head, write)`` answers each connection."""

    def __init__(self, host: str, reply) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    piece = self.request.recv(4096)
                    if not piece:
                        return
                    head += piece
                text = head.decode("latin-1")
                outer.requests.append(text)
                try:
                    reply(text, self.request.sendall)
                except OSError:
                    pass  # the client went away: what we test

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.tcp = socketserver.ThreadingTCPServer((host, 0), Handler)
        self.tcp.daemon_threads = True
        threading.Thread(target=self.tcp.serve_forever, daemon=True).start()
        self.url = f"http://{host}:{self.tcp.server_address[1]}"

    def close(self) -> None:
        self.tcp.shutdown()
        self.tcp.server_close()


@pytest.fixture
def servers():
    made: list[Server] = []

    def make(host: str, reply) -> Server:
        if not _loopback(host):
            pytest.skip(f"{host} is not a local address here")
        made.append(Server(host, reply))
        return made[-1]

    yield make
    for s in made:
        s.close()


def ok(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                   "result": []}}).encode()


@pytest.fixture
def token(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    return str(path)


def test_redirect_to_another_host_is_refused_without_sending_credentials(servers, token):
    other = servers("127.0.0.2", lambda head, write: write(ok(EMPTY)))
    first = servers("127.0.0.1", lambda head, write: write(
        f"HTTP/1.1 302 Found\r\nLocation: {other.url}/api/v1/query?query=up\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()))
    client = PromClient(first.url, PromAuth(bearer_token_file=token), timeout=5)
    with pytest.raises(PromError) as err:
        client.query("up")
    text = str(err.value)
    assert "another host" in text and "127.0.0.2" in text and "s3cret" not in text
    assert "Authorization: Bearer s3cret-token" in first.requests[0]
    assert not any("authorization" in r.lower() for r in other.requests), other.requests


def test_redirect_within_the_same_host_is_followed(servers, token):
    def reply(head: str, write) -> None:
        if head.startswith("GET /prom/"):
            write(ok(EMPTY))
        else:
            write(b"HTTP/1.1 301 Moved\r\nLocation: /prom/api/v1/query?query=up\r\n"
                  b"Content-Length: 0\r\nConnection: close\r\n\r\n")

    server = servers("127.0.0.1", reply)
    client = PromClient(server.url, PromAuth(bearer_token_file=token), timeout=5)
    assert client.query("up") == []
    assert all("Bearer s3cret-token" in r for r in server.requests) and len(server.requests) == 2


def drip(head: str, write) -> None:
    """Headers and an endless body, one byte at a time: every read succeeds, none ends it."""
    write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    for _ in range(100000):
        write(b" ")
        time.sleep(0.2)


def test_a_dripping_server_is_cut_at_one_deadline_for_the_whole_query(servers):
    server = servers("127.0.0.1", drip)
    client = PromClient(server.url, timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(PromError) as err:
        client.query("up")
    # Each read returns within 0.2 s: only a deadline over the whole query ends it (a bound
    # of a read would wait forever; the test's own timeout would say so).
    assert "no whole answer within 1 s" in str(err.value)
    assert time.monotonic() - t0 < SLOW


def test_series_past_the_bound_are_refused_while_the_answer_still_arrives(servers):
    item = b'{"metric":{"instance":"n","gpu":"0"},"value":[1,"1"]},'

    def endless(head: str, write) -> None:
        write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
              b'{"status":"success","data":{"resultType":"vector","result":[')
        for _ in range(10 ** 6):  # never closes the array: only a bound while reading ends it
            write(item * 100)
            time.sleep(0.01)

    server = servers("127.0.0.1", endless)
    client = PromClient(server.url, timeout=SLOW * 2, max_series=1000)
    with pytest.raises(PromError) as err:
        client.query("up", what="the dcgm:util_gpu query")
    text = str(err.value)
    assert "the dcgm:util_gpu query: over 1000 series, refused while reading" in text
    assert "--prom-max-series" in text


def test_watch_says_down_in_one_line_when_the_server_drips(servers):
    server = servers("127.0.0.1", drip)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputop", "watch", "--json", "--prometheus", server.url,
         "--prom-timeout", "1", "--duration", "8"], env=cli_env(), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=3 * SLOW)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines and lines[0]["kind"] == "prometheus" and lines[0]["state"] == "down", lines
    assert "no whole answer within 1 s" in lines[0]["reason"]
    assert sum(1 for x in lines if x.get("state") == "down") == 1
