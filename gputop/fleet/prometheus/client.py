"""A small client of the Prometheus HTTP API (``/api/v1/query``, ``query_range``,
``status/config``) over the standard library's urllib.

What it guards against, since the server and what it stores are outside our control:
* every answer is bounded in bytes (read in pieces, refused past ``max_bytes``) and in series
  (refused past ``max_series``); a query has a timeout, sent to the server too;
* label values are untrusted: ``quote`` makes one a PromQL string literal (never pasted as
  query text), and what is shown is escaped by the caller (``one_line``);
* secrets (the bearer token, the basic-auth password, the client key) are read from files
  and never printed: an error names the URL without credentials and the HTTP status only.
Errors are ``PromError``, one line.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import re
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, NoReturn

import msgspec

from gputop.fleet.prometheus import transport
from gputop.fleet.prometheus.transport import Limits
from gputop.fleet.wire import one_line

MAX_BYTES = 64 * 1024 * 1024  # one answer: 1,000 nodes x 8 GPUs of one metric is ~1 MB
# Per query: the fleet's queries answer one series per GPU at most (aggregated on the server),
# so this holds 25,000 nodes of 8 GPUs.
MAX_SERIES = 200_000
TIMEOUT_S = 10.0


_decode = msgspec.json.Decoder().decode  # ~3x json.loads on a 10 MB answer


class SeriesLabels(msgspec.Struct):
    """The labels a fleet's range query keeps (it aggregates to these); others are dropped."""

    instance: str = ""
    gpu: str = ""
    name: str = msgspec.field(default="", name="__name__")


class RangeSeries(msgspec.Struct):
    """One series of a matrix answer, its samples left as JSON text: they are read one
    series at a time (``points``), so an 80,000-GPU answer never becomes a tree of Python
    lists (~1 KB a series) all at once."""

    metric: SeriesLabels = msgspec.field(default_factory=SeriesLabels)
    values: msgspec.Raw = msgspec.Raw(b"[]")

    def points(self) -> list[tuple[float, str]]:
        """[(t, "v")]; PromError when they are not that."""
        try:
            return _points(self.values)
        except msgspec.DecodeError:
            raise PromError("a series' samples are not [time, \"value\"] pairs") from None


class _Matrix(msgspec.Struct):
    resultType: str = ""
    result: list[RangeSeries] = msgspec.field(default_factory=list)


class _MatrixAnswer(msgspec.Struct):
    status: str = ""
    data: _Matrix | None = None


_decode_matrix = msgspec.json.Decoder(_MatrixAnswer).decode
_points = msgspec.json.Decoder(list[tuple[float, str]]).decode


class PromError(Exception):
    """The server did not answer usefully: one line, no secret in it."""


@dataclass(frozen=True)
class PromAuth:
    bearer_token_file: str | None = None
    username: str | None = None
    password_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False


def quote(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal (label matchers): backslash, the
    quote and control characters escaped, so a label value never becomes query text."""
    out = ['"']
    for ch in str(value):
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(64 * 1024)
    except OSError as exc:
        raise PromError(f"cannot read the {what} file {one_line(path, 200)}: "
                        f"{exc.strerror or type(exc).__name__}") from None
    value = text.strip()
    if not value:
        raise PromError(f"the {what} file {one_line(path, 200)} is empty")
    return value


def _redact(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return one_line(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")), 200)


class PromClient:
    """One Prometheus server. Safe to call from several threads at once (a refresh sends its
    queries together); counts the queries made and the bytes received, for the screen and the
    benchmark."""

    def __init__(self, url: str, auth: PromAuth | None = None, timeout: float = TIMEOUT_S,
                 max_bytes: int = MAX_BYTES, max_series: int = MAX_SERIES) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PromError(f"--prometheus takes an http:// or https:// URL, not "
                            f"{one_line(url, 100)!r}")
        self.base = url.rstrip("/")
        self.shown = _redact(url)
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_series = max_series
        self.queries = 0
        self.bytes = 0
        self._count = threading.Lock()  # a refresh sends its queries at once (threads)
        self._names: dict[str, tuple[float, set[str]]] = {}
        auth = auth or PromAuth()
        self._headers = {"Accept": "application/json", "User-Agent": "gputop"}
        if parts.username:  # user:password@ in the URL, as curl takes it
            self._basic(urllib.parse.unquote(parts.username),
                        urllib.parse.unquote(parts.password or ""))
            self.base = urllib.parse.urlunsplit(
                (parts.scheme, parts.netloc.rsplit("@", 1)[1], parts.path, "", "")).rstrip("/")
        if auth.bearer_token_file:
            token = _read_secret(auth.bearer_token_file, "bearer token")
            self._headers["Authorization"] = f"Bearer {token}"
        elif auth.username is not None:
            password = _read_secret(auth.password_file, "password") if auth.password_file \
                else ""
            self._basic(auth.username, password)
        self._context = None
        if parts.scheme == "https":
            try:
                ctx = ssl.create_default_context(cafile=auth.ca_file)
                if auth.cert_file:
                    ctx.load_cert_chain(auth.cert_file, auth.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise PromError(f"TLS setup: {one_line(getattr(exc, 'strerror', None) or exc, 200)}"
                                ) from None
            if auth.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._context = ctx

    def _basic(self, user: str, password: str) -> None:
        raw = f"{user}:{password}".encode()
        self._headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()

    # -- transport ---------------------------------------------------------------------------

    def get(self, path: str, params: dict[str, str] | None = None,
            deadline: float | None = None, what: str = "the answer",
            max_series: int | None = None) -> Any:
        """The ``data`` of a successful API answer; PromError otherwise. ``deadline``
        (monotonic) bounds the whole exchange, reads included; by default ``timeout`` from
        now. ``what`` names the query in a refusal."""
        body = self._body(path, params, deadline, what, max_series)
        try:
            answer = _decode(body)
        except (ValueError, RecursionError, msgspec.DecodeError):
            raise PromError(f"{self.shown}: the answer is not JSON") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            self._failed(body)
        return answer.get("data")

    def _failed(self, body: bytes) -> NoReturn:
        detail = _api_error(body)
        raise PromError(f"{self.shown}: the query failed" + (f": {detail}" if detail else ""))

    def _body(self, path: str, params: dict[str, str] | None, deadline: float | None,
              what: str, max_series: int | None) -> bytes:
        """One exchange's body, bounded (bytes, series, the deadline); PromError otherwise."""
        query = urllib.parse.urlencode(params or {})
        url = f"{self.base}{path}" + (f"?{query}" if query else "")
        with self._count:
            self.queries += 1
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        limits = Limits(self.max_bytes, max_series, what)
        try:
            body = transport.get(url, self._headers, deadline, limits, self._context,
                                 self._received)
        except transport.HttpStatus as exc:
            detail = _api_error(exc.body)
            raise PromError(f"{self.shown}: HTTP {exc.status}" +
                            (f": {detail}" if detail else "")) from None
        except transport.TransportError as exc:
            raise PromError(f"{self.shown}: {exc}") from None
        except TimeoutError:
            raise PromError(f"{self.shown}: {what}: no whole answer within "
                            f"{self.timeout:g} s (--prom-timeout)") from None
        except ssl.SSLError as exc:
            raise PromError(f"{self.shown}: TLS: {one_line(exc.reason or exc, 200)}") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise PromError(f"{self.shown}: {one_line(text, 200)}") from None
        return body

    def _received(self, n: int) -> None:
        with self._count:
            self.bytes += n

    # -- the API -----------------------------------------------------------------------------

    def _server_timeout(self, deadline: float | None) -> str:
        left = self.timeout if deadline is None else deadline - time.monotonic()
        return f"{max(100, int(left * 1000))}ms"  # a Prometheus duration: no decimals

    def query(self, expr: str, at: float | None = None, deadline: float | None = None,
              what: str = "the query") -> list[dict]:
        """An instant vector: [{"metric": {...}, "value": [t, "v"]}]."""
        params = {"query": expr, "timeout": self._server_timeout(deadline)}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._result(self.get("/api/v1/query", params, deadline, what,
                                     self.max_series), "vector", what)

    def query_range(self, expr: str, start: float, end: float, step: float,
                    deadline: float | None = None, what: str = "the query") -> list[dict]:
        """A range matrix: [{"metric": {...}, "values": [[t, "v"], ...]}]."""
        params = self._range_params(expr, start, end, step, deadline)
        return self._result(self.get("/api/v1/query_range", params, deadline, what,
                                     self.max_series), "matrix", what)

    def _range_params(self, expr: str, start: float, end: float, step: float,
                      deadline: float | None) -> dict[str, str]:
        return {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                "step": f"{max(step, 0.001):g}", "timeout": self._server_timeout(deadline)}

    def query_range_series(self, expr: str, start: float, end: float, step: float,
                           deadline: float | None = None, what: str = "the query"
                           ) -> list[RangeSeries]:
        """A range matrix aggregated to (``__name__``,) ``instance`` and ``gpu``, as
        ``RangeSeries`` whose samples are read one series at a time."""
        params = self._range_params(expr, start, end, step, deadline)
        body = self._body("/api/v1/query_range", params, deadline, what, self.max_series)
        try:
            answer = _decode_matrix(body)
        except msgspec.ValidationError:  # JSON, but not shaped as a matrix answer
            answer = None
        except (ValueError, RecursionError, msgspec.DecodeError):
            raise PromError(f"{self.shown}: the answer is not JSON") from None
        if answer is not None and answer.status != "success":
            self._failed(body)
        data = answer.data if answer is not None else None
        if data is None or data.resultType != "matrix":
            raise PromError(f"{self.shown}: {what}: not a matrix answer")
        return self._counted(data.result, what)

    def _result(self, data: Any, kind: str, what: str) -> list[dict]:
        if not isinstance(data, dict) or data.get("resultType") != kind:
            raise PromError(f"{self.shown}: {what}: not a {kind} answer")
        result = data.get("result")
        if not isinstance(result, list):
            raise PromError(f"{self.shown}: {what}: not a {kind} answer")
        return self._counted(result, what)

    def _counted(self, result: list, what: str) -> list:
        """``result`` when it has ``max_series`` series or fewer; PromError otherwise."""
        if len(result) > self.max_series:
            raise PromError(f"{self.shown}: {what}: {len(result)} series (limit "
                            f"{self.max_series}, --prom-max-series; narrow it with filters)")
        return result

    def names_present(self, pattern: str, at: float, ttl: float = 300.0) -> set[str] | None:
        """The metric names matching ``pattern`` the server holds near ``at`` (label values
        of ``__name__``; asked again after ``ttl`` s), or None when it cannot say: then every
        field is asked for. Fields no node exports cost no query."""
        cached = self._names.get(pattern)
        if cached is not None and time.monotonic() - cached[0] < ttl:
            return cached[1]
        params = {"match[]": f'{{__name__=~"{pattern}"}}', "start": f"{at - 600:.3f}",
                  "end": f"{at:.3f}"}
        try:
            data = self.get("/api/v1/label/__name__/values", params,
                            what="the metric names query", max_series=100_000)
        except PromError as exc:
            if ": HTTP " in str(exc):  # a store without this API: ask for every field
                return None
            raise
        if not isinstance(data, list):
            return None
        names = {n for n in data if isinstance(n, str)}
        self._names[pattern] = (time.monotonic(), names)
        return names

    def scrape_interval(self) -> float | None:
        """The server's global scrape interval (``status/config``), or None when unknown."""
        data = self.get("/api/v1/status/config", what="the server's config")
        text = data.get("yaml") if isinstance(data, dict) else None
        if not isinstance(text, str):
            return None
        found = re.search(r"^\s*scrape_interval:\s*([0-9smhdw.]+)\s*$", text, re.MULTILINE)
        return parse_duration(found.group(1)) if found else None


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float | None:
    """A Prometheus duration (``15s``, ``1m30s``) in seconds, or None."""
    parts = re.findall(r"([0-9.]+)(ms|s|m|h|d|w)", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        return None
    total = sum(float(a) * _UNITS[b] for a, b in parts)
    return total if math.isfinite(total) and total > 0 else None


def _api_error(body: bytes) -> str:
    try:
        data = json.loads(body[:64 * 1024])
    except (ValueError, RecursionError):
        return ""
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return one_line(data["error"], 200)
    return ""


def number(value: Any) -> float | None:
    """A sample's value ("1.5", "NaN", "+Inf") as a finite float, or None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def now() -> float:
    return time.time()
