"""The Prometheus client's guards and the job grouping, against a real HTTP server in the test
(bounded answers, secrets never printed, label values quoted and escaped)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from gputop.fleet.prometheus.client import PromAuth, PromClient, PromError, parse_duration, quote
from gputop.fleet.prometheus.jobs import pod_owner
from gputop.fleet.prometheus.sources import Filters, fetch


class _Server:
    def __init__(self, body: bytes, status: int = 200) -> None:
        self.body, self.status, self.seen = body, status, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.seen.append((self.path, dict(self.headers)))
                body = outer.body(self.path) if callable(outer.body) else outer.body
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def server():
    made = []

    def make(body: bytes, status: int = 200) -> _Server:
        s = _Server(body, status)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def vector(items: list[dict]) -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": "vector", "result": items}}).encode()


def test_quote_keeps_a_label_value_a_string():
    assert quote('a"} or vector(1) #') == '"a\\"} or vector(1) #"'
    assert quote("x\\y\nz\x1b") == '"x\\\\y\\nz\\x1b"'
    sel = Filters.make(namespace='ml"} or up{x="').selector()
    assert sel == '{GPU_I_ID="", namespace="ml\\"} or up{x=\\""}'
    with pytest.raises(ValueError):
        Filters.make(labels=["bad name=1"])


def test_answers_are_bounded_in_bytes_and_series(server):
    big = server(vector([{"metric": {"i": str(i)}, "value": [1, "1"]} for i in range(50)]))
    with pytest.raises(PromError, match="the up query: over 10 series, refused while reading"):
        PromClient(big.url, max_series=10).query("up", what="the up query")
    with pytest.raises(PromError, match="over 100 bytes, refused while reading"):
        PromClient(big.url, max_bytes=100).query("up")
    assert len(PromClient(big.url).query("up")) == 50


def test_secrets_are_sent_never_printed(server, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-T0ken\n")
    refused = server(b'{"status":"error","error":"unauthorized"}', status=401)
    client = PromClient(refused.url, PromAuth(bearer_token_file=str(token)))
    with pytest.raises(PromError) as err:
        client.query("up")
    assert "HTTP 401" in str(err.value) and "s3cret" not in str(err.value)
    assert refused.seen[0][1]["Authorization"] == "Bearer s3cret-T0ken"
    url = refused.url.replace("http://", "http://admin:pa55w0rd@")
    with pytest.raises(PromError) as err:
        PromClient(url).query("up")
    assert "pa55w0rd" not in str(err.value) and "admin" not in str(err.value)
    with pytest.raises(PromError, match="cannot read the password file"):
        PromClient(refused.url, PromAuth(username="u", password_file=str(tmp_path / "none")))


def test_label_values_from_the_store_are_escaped(server):
    evil = "node\x1b[2J\u202e-a"
    labels = {"instance": "n:1", "gpu": "0", "Hostname": evil, "hpc_job": "7\x07"}

    def answer_for(path: str) -> bytes:
        if path.startswith("/api/v1/query_range"):
            return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {**labels, "__name__": "DCGM_FI_DEV_GPU_UTIL"}, "values": [[1, "5"]]}]}}).encode()
        return vector([{"metric": labels, "value": [1, "1"]}])

    answer = server(answer_for)
    data = fetch(PromClient(answer.url), 0, 1, 1)
    ref = data.gpus[("n:1", 0)]
    assert "\x1b" not in ref.host and "\u202e" not in ref.host and "\\x1b" in ref.host
    assert ref.labels["hpc_job"] == "7\\x07"
    assert data.series.points(("n:1", 0), "util_gpu") == [(1.0, 5.0)]


def test_not_json_and_down_are_one_line(server):
    junk = server(b"<html>proxy error</html>")
    with pytest.raises(PromError, match="not JSON"):
        PromClient(junk.url).query("up")
    with pytest.raises(PromError, match="Connection refused"):
        PromClient("http://127.0.0.1:1").query("up")
    with pytest.raises(PromError, match="http:// or https://"):
        PromClient("ftp://x")


def test_pod_owner_and_durations():
    assert pod_owner("train-worker-3") == "train"
    assert pod_owner("bert-7") == "bert"
    assert pod_owner("etl-x7k2p") == "etl"
    assert pod_owner("plain") == "plain"
    assert parse_duration("1m30s") == 90 and parse_duration("15s") == 15
    assert parse_duration("bogus") is None


def test_promfleet_never_imports_textual():
    """`watch --prometheus` draws nothing: the package stays importable without Textual."""
    import subprocess
    import sys

    from tests.conftest import REPO, cli_env

    code = ("import importlib, pkgutil, sys, gputop.fleet.prometheus as p\n"
            "for i in pkgutil.walk_packages(p.__path__, 'gputop.fleet.prometheus.'):\n"
            "    importlib.import_module(i.name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def matrix(result: list) -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": "matrix", "result": result}}).encode()


def test_range_answers_are_read_onto_the_grid_and_bad_ones_refused(server):
    """A range answer goes into the columns series by series: samples on the query's grid,
    NaN and off-grid samples left out, the dcgm total made of used + free; a matrix of the
    wrong shape is one line."""
    labels = {"instance": "n:1", "gpu": "0", "Hostname": "node-a"}

    def answer_for(path: str) -> bytes:
        if path.startswith("/api/v1/query_range"):
            if "FB_USED" in path or "MEMORY_USED" in path:
                return matrix([{"metric": {"instance": "n:1", "gpu": "0"},
                                "values": [[0, "1048576"], [10, "2097152"]]}])
            if "FB_FREE" in path or "MEMORY_FREE" in path:
                return matrix([{"metric": {"instance": "n:1", "gpu": "0"},
                                "values": [[10, "1048576"]]}])
            if "GPU_UTIL" in path:
                return matrix([{"metric": {"instance": "n:1", "gpu": "0"},
                                "values": [[0, "5"], [5, "NaN"], [7.5, "9"], [10, "+Inf"]]}])
            return matrix([])
        return vector([{"metric": labels, "value": [10, "1"]}])

    data = fetch(PromClient(server(answer_for).url), 0, 10, 5)
    key = ("n:1", 0)
    assert data.series.times() == [0.0, 5.0, 10.0]
    assert data.series.points(key, "util_gpu") == [(0.0, 5.0)]  # NaN, Inf, off the grid: out
    assert data.series.points(key, "mem_used") == [(0.0, 1048576.0), (10.0, 2097152.0)]
    assert data.series.points(key, "mem_total") == [(10.0, 3145728.0)]
    assert data.series.last(key, "mem_used") == 2097152.0
    assert data.series.last(("n:9", 0), "mem_used") is None

    for bad in (matrix([{"metric": {"instance": 7, "gpu": "0"}, "values": []}]),
                json.dumps({"status": "success", "data": {"resultType": "vector",
                                                          "result": []}}).encode()):
        with pytest.raises(PromError, match="the q query: not a matrix answer"):
            PromClient(server(bad).url).query_range_series("up", 0, 10, 5, what="the q query")
    pairs = PromClient(server(matrix([{"metric": {}, "values": [["x"]]}])).url)
    with pytest.raises(PromError, match=r'not \[time, "value"\] pairs'):
        pairs.query_range_series("up", 0, 10, 5)[0].points()


def test_a_refresh_never_grows_past_its_bound_of_values():
    """A column holds MAX_VALUES at most: a sample at row x time past it is refused in one
    line, not allocated (a server's answer decides the rows)."""
    from gputop.fleet.prometheus.sources import MAX_VALUES, Columns

    cols = Columns(0, 9, 1)  # 10 times
    cols.put("util_gpu", cols.row(("n:1", 0)), 9, 1.0)
    assert cols.last(("n:1", 0), "util_gpu") == 1.0
    with pytest.raises(PromError, match=f"more than {MAX_VALUES} samples of util_gpu"):
        cols.put("util_gpu", MAX_VALUES // 10, 0, 1.0)
    assert len(cols.values["util_gpu"]) == 10
