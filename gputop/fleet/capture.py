"""`p` on a remote job: ask that node's gputop to capture (`ssh NODE gputop capture PID
--json`), and read its diagnosis here. The trace stays on the node; its path is shown with the
command that fetches it.

The reply is untrusted: bounded in size, decoded as JSON, checked field by field, every string
escaped; a finding id this gputop does not know is left out and said so.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from gputop.core.format import safe_text
from gputop.core.validate import real
from gputop.fleet.ssh import SshSettings
from gputop.fleet.wire import MAX_TEXT, one_line

MAX_REPLY = 16 << 20  # bytes of `capture --json` output (metrics of a big trace: ~1 MB)
MAX_STDERR = 8192
EXTRA_WAIT_S = 60.0  # beyond the capture's own timeout: ssh, export and analysis


class RemoteCaptureError(Exception):
    """One escaped line for the user."""


@dataclass
class RemoteCapture:
    host: str
    pid: int
    trace: str  # on the node, escaped
    verdict: str
    analysis: object | None  # a diagnostics.trace.TraceAnalysis rebuilt from the reply
    skipped: list[str] = field(default_factory=list)  # finding ids this gputop does not know

    @property
    def fetch_command(self) -> str:
        return f"scp {self.host}:{self.trace} ."


def capture_argv(settings: SshSettings, host: str, pid: int, steps: int, timeout: float
                 ) -> list[str]:
    command = settings.gputop_command("capture", str(pid), "--steps", str(steps), "--timeout",
                                      f"{timeout:g}", "--json")
    return settings.ssh_argv(host, command)


def run_remote_capture(settings: SshSettings, host: str, pid: int, steps: int = 3,
                       timeout: float = 60.0, should_stop: Callable[[], bool] | None = None
                       ) -> RemoteCapture:
    """Blocks (run it in a thread). Raises RemoteCaptureError with one line on any failure."""
    argv = capture_argv(settings, host, pid, steps, timeout)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise RemoteCaptureError(f"cannot run {settings.program}: {exc.strerror or exc}") \
            from None
    out, err, why = _collect(proc, time.monotonic() + timeout + EXTRA_WAIT_S, should_stop)
    if why:
        raise RemoteCaptureError(f"capture of pid {pid} on {host}: {why}")
    code = proc.returncode
    if code != 0:
        line = _last_line(err)
        if code == 255:
            raise RemoteCaptureError(f"{host}: {line or 'ssh failed'}")
        line = line.removeprefix("gputop: error: ")
        raise RemoteCaptureError(f"{host}: {line or f'capture exited with status {code}'}")
    return parse_reply(host, pid, out)


def _collect(proc: subprocess.Popen, deadline: float,
             should_stop: Callable[[], bool] | None) -> tuple[bytes, bytes, str]:
    out, err = bytearray(), bytearray()
    why = ""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            if should_stop is not None and should_stop():
                why = "abandoned"
                break
            if time.monotonic() > deadline:
                why = "no answer in time"
                break
            for key, _ in selector.select(timeout=0.25):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                buffer += chunk
                if buffer is err and len(err) > MAX_STDERR:
                    del err[: len(err) - MAX_STDERR]
            if len(out) > MAX_REPLY:
                why = f"a reply larger than {MAX_REPLY >> 20} MiB"
                break
    if why:
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass
    try:
        proc.wait(10.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    return bytes(out), bytes(err), why


def _last_line(data: bytes) -> str:
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return one_line(lines[-1]) if lines else ""


def _text(value: object, limit: int = MAX_TEXT) -> str:
    return safe_text(value)[:limit] if isinstance(value, str) else ""


def parse_reply(host: str, pid: int, data: bytes) -> RemoteCapture:
    try:
        reply = msgspec.json.decode(data.strip().splitlines()[-1] if data.strip() else b"")
    except (msgspec.DecodeError, IndexError):
        raise RemoteCaptureError(f"{host}: the capture's reply is not JSON") from None
    if not isinstance(reply, dict):
        raise RemoteCaptureError(f"{host}: the capture's reply is not a JSON object")
    trace = reply.get("trace")
    if not isinstance(trace, str) or not trace or len(trace) > 4096:
        raise RemoteCaptureError(f"{host}: the capture's reply names no trace")
    if "error" in reply:
        raise RemoteCaptureError(f"{host}: cannot analyze {one_line(trace)}: "
                                 f"{one_line(reply['error'])}")
    verdict = reply.get("verdict")
    if not isinstance(verdict, str) or not verdict:
        raise RemoteCaptureError(f"{host}: the capture's reply has no verdict")
    analysis, skipped = _analysis(reply)
    return RemoteCapture(host, pid, safe_text(trace), one_line(verdict, 64), analysis, skipped)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


def _analysis(reply: dict) -> tuple[object | None, list[str]]:
    """A TraceAnalysis made of the reply's checked parts, for the diagnosis screen."""
    from gputop.diagnostics.findings import CATALOGUE, SEVERITY_RANK, Finding
    from gputop.diagnostics.trace.analysis import TraceAnalysis

    findings, skipped = [], []
    raw = reply.get("findings")
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        fid, severity = item.get("id"), item.get("severity")
        # Any JSON value may stand here (a list is not even hashable): strings only.
        if (not isinstance(fid, str) or not isinstance(severity, str)
                or fid not in CATALOGUE or severity not in SEVERITY_RANK):
            skipped.append(one_line(fid, 48))
            continue
        cost = item.get("cost_s")
        findings.append(Finding(
            id=fid, severity=severity, title=_text(item.get("title")),
            evidence=_text(item.get("evidence")), fix=_text(item.get("fix")),
            next_step=_text(item.get("next_step")),
            cost_s=real(cost, 0.0, 1e9) or 0.0,
            gpu=item.get("gpu") if _whole(item.get("gpu")) else None,
            pid=item.get("pid") if _whole(item.get("pid")) else None,
            where=_text(item.get("where")) or None))
    metrics = reply.get("metrics")

    def strings(values: object) -> list[str]:
        return [_text(v, 200) for v in values if isinstance(v, str)] \
            if isinstance(values, list) else []

    analysis = TraceAnalysis(
        file=_text(reply.get("file")) or _text(reply.get("trace")),
        metrics=metrics if isinstance(metrics, dict) else {},
        findings=findings,
        verdict=one_line(reply.get("verdict"), 64),
        healthy_reason=_text(reply.get("healthy_reason")) or None,
        assessed=strings(reply.get("assessed")),
        not_assessed=strings(reply.get("not_assessed")),
        cut=strings(reply.get("cut")),
    )
    return analysis, skipped


def report_text(capture: RemoteCapture, width: int) -> str:
    """The `gputop analyze` report of the node's capture; the metrics came from the node, so a
    report that cannot be laid out from them falls back to the findings alone."""
    analysis = capture.analysis
    try:
        from gputop.diagnostics.trace.reporting.report import format_report

        text = format_report(analysis, width)
    except Exception:
        lines = [f"verdict: {capture.verdict}", ""]
        for i, f in enumerate(getattr(analysis, "findings", []), 1):
            lines += [f"{i}. [{f.severity.upper()}] {f.id}: {f.title}",
                      f"   Evidence: {f.evidence}", f"   Fix: {f.fix}", f"   Next: {f.next_step}",
                      ""]
        text = "\n".join(lines)
    if capture.skipped:
        text += f"\n(findings this gputop does not know, left out: {', '.join(capture.skipped)})"
    return "\n".join(safe_text(line) for line in text.splitlines())
