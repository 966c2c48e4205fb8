"""Keep one `ssh NODE gputop stream` per node running, and the newest state of each node.

One I/O thread serves every node: a selector over the ssh processes' stdout and stderr, line
assembly with a length bound, decoding (``wire``), and the timers (a node gone quiet, retries).
A node that is down, slow, without gputop or sending garbage is shown as such and retried with
exponential backoff; nothing a node does reaches another node or the caller's thread, which
only ever reads immutable ``NodeView`` objects.
"""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gputop.core.model import Snapshot
from gputop.fleet.ssh import SshSettings
from gputop.fleet.wire import (
    MAX_LINE,
    Hello,
    RemoteFinding,
    Sample,
    StreamError,
    WireError,
    decode_line,
    one_line,
)

# Node states, as shown.
CONNECTING, UP, SLOW, DOWN, NO_GPUTOP, BAD = (
    "connecting", "up", "slow", "down", "no gputop", "bad data")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
HELLO_TIMEOUT_S = 30.0  # ssh connected (or not) and the node's gputop said hello
STDERR_KEEP = 4096  # bytes of a node's stderr kept for the reason shown
JUNK_LINES = 100  # lines before the hello that are skipped (a chatty shell rc file)
RECENT = 60  # samples kept per node for the node screen's charts


@dataclass(frozen=True)
class NodeView:
    """What the screen and `watch` see of one node. ``host`` is the name the user gave;
    everything else that came from the node is escaped and bounded."""

    host: str
    state: str = CONNECTING
    reason: str = ""
    snapshot: Snapshot | None = None
    findings: tuple[RemoteFinding, ...] = ()
    remote_hostname: str = ""
    remote_version: str = ""
    seq: int = 0  # samples received since gputop started: a new one means new data
    last_data: float | None = None  # time.monotonic() of the last sample
    retry_at: float | None = None  # time.monotonic() of the next attempt (down and the like)
    since: float = field(default_factory=time.monotonic)  # when the state was entered
    connects: int = 0

    @property
    def live(self) -> bool:
        return self.state in (UP, SLOW)


class _Link:
    """One node's ssh process and the bytes read from it. Used on the I/O thread only."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.proc: subprocess.Popen | None = None
        self.out = bytearray()
        self.err = bytearray()
        self.started = 0.0
        self.hello: Hello | None = None
        self.junk = 0
        self.failure: tuple[str, str] | None = None  # (state, reason) decided while reading
        self.eof_out = False
        self.eof_err = False
        self.closed_at: float | None = None
        self.backoff = BACKOFF_FIRST_S
        self.up_since: float | None = None
        self.hello_at = 0.0
        self.last_sample: float | None = None  # time.monotonic() of this connection's last


class FleetMonitor:
    """Start with ``start()``; read ``views()``; ``on_change`` is called (on the I/O thread) when
    a node has news. ``stop()`` ends every ssh process."""

    def __init__(self, hosts: Sequence[str], settings: SshSettings, interval: float = 1.0,
                 on_change: Callable[[], None] | None = None,
                 stale_after: float | None = None, dead_after: float | None = None) -> None:
        self.hosts = list(hosts)
        self.settings = settings
        self.interval = interval
        self.on_change = on_change
        # Slow: no sample for 3 intervals (at least 5 s). Dead: no sample for 10 intervals (at
        # least 30 s); the ssh keep-alives usually notice a dead node before that.
        self.stale_after = stale_after or max(5.0, 3 * interval)
        self.dead_after = dead_after or max(30.0, 10 * interval)
        self._views: dict[str, NodeView] = {h: NodeView(h) for h in self.hosts}
        self._recent: dict[str, deque[Snapshot]] = {h: deque(maxlen=RECENT) for h in self.hosts}
        self._links = {h: _Link(h) for h in self.hosts}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="fleet-io", daemon=True)
        self.version = 0  # bumped on every change

    # -- the caller's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def views(self) -> list[NodeView]:
        """Every node, in the order given."""
        with self._lock:
            return [self._views[h] for h in self.hosts]

    def view(self, host: str) -> NodeView | None:
        with self._lock:
            return self._views.get(host)

    def recent(self, host: str) -> list[Snapshot]:
        """The node's last samples (oldest first), for charts."""
        with self._lock:
            return list(self._recent.get(host, ()))

    def retry_now(self, host: str) -> None:
        """Skip the wait of a node that is down (the user asked)."""
        link = self._links.get(host)
        if link is not None:
            link.backoff = BACKOFF_FIRST_S
            with self._lock:
                view = self._views[host]
                if view.retry_at is not None:
                    self._views[host] = replace(view, retry_at=time.monotonic())
            self._wake()

    # -- the I/O thread ------------------------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _set(self, host: str, **changes) -> None:
        with self._lock:
            view = self._views[host]
            if "state" in changes and changes["state"] != view.state:
                changes.setdefault("since", time.monotonic())
            self._views[host] = replace(view, **changes)
            self.version += 1

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # a closing UI must not take the I/O thread with it
                pass

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                changed = self._tick_timers()
                for key, _ in self._selector.select(timeout=0.25):
                    if key.data is None:
                        try:
                            os.read(self._wake_r, 4096)
                        except OSError:
                            pass
                        continue
                    link, which = key.data
                    changed |= self._read(link, which, key.fileobj)
                if changed:
                    self._changed()
        finally:
            self._end_all()
            self._selector.close()
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _tick_timers(self) -> bool:
        now = time.monotonic()
        changed = False
        for host, link in self._links.items():
            view = self._views[host]
            if link.proc is None:
                if view.retry_at is None or now >= view.retry_at:
                    self._connect(link)
                    changed = True
                continue
            if link.closed_at is not None or (link.eof_out and link.proc.poll() is not None):
                changed |= self._reap(link, now)
                continue
            if link.eof_out:
                link.closed_at = now
                continue
            if link.hello is None:
                if now - link.started > HELLO_TIMEOUT_S:
                    self._fail(link, DOWN, f"no answer from gputop in {HELLO_TIMEOUT_S:.0f} s")
                    changed = True
                continue
            # Quiet since the last sample of this connection (or its hello); the first sample
            # gets twice the time (NVML and the node's sampler are starting).
            quiet = now - (link.last_sample or link.hello_at)
            stale = self.stale_after if link.last_sample else 2 * self.stale_after
            if quiet > self.dead_after:
                self._fail(link, DOWN, f"no data for {quiet:.0f} s")
                changed = True
            elif quiet > stale:
                reason = f"no data for {quiet:.0f} s"
                if view.state in (UP, CONNECTING) or view.reason != reason:
                    self._set(host, state=SLOW, reason=reason)
                    changed = True
        return changed

    def _connect(self, link: _Link) -> None:
        command = self.settings.gputop_command("stream")
        argv = self.settings.ssh_argv(link.host, command)
        link.out.clear()
        link.err.clear()
        link.hello, link.junk, link.failure = None, 0, None
        link.eof_out = link.eof_err = False
        link.closed_at = None
        link.up_since = None
        link.last_sample = None
        link.started = time.monotonic()
        try:
            link.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                # Its own session: no controlling terminal to prompt on, and the monitor's
                # Ctrl-C is not sent to it.
                start_new_session=True,
            )
        except OSError as exc:
            link.proc = None
            self._schedule_retry(link, DOWN, f"cannot run {self.settings.program}: "
                                             f"{exc.strerror or exc}")
            return
        for pipe, which in ((link.proc.stdout, "out"), (link.proc.stderr, "err")):
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ, (link, which))
        view = self._views[link.host]
        if view.state in (DOWN, NO_GPUTOP, BAD):
            # A retry keeps the last failure on show (and `watch` quiet) until it succeeds.
            self._set(link.host, retry_at=None, connects=view.connects + 1)
        else:
            self._set(link.host, state=CONNECTING, reason="", retry_at=None,
                      connects=view.connects + 1)

    def _read(self, link: _Link, which: str, pipe) -> bool:
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._selector.unregister(pipe)
            if which == "out":
                link.eof_out = True
            else:
                link.eof_err = True
            return False
        if which == "err":
            link.err += chunk
            if len(link.err) > STDERR_KEEP:
                del link.err[: len(link.err) - STDERR_KEEP]
            return False
        if link.failure is not None:
            return False  # already condemned: drain until it exits
        link.out += chunk
        changed = False
        while True:
            end = link.out.find(b"\n")
            if end < 0:
                break
            line = bytes(link.out[:end])
            del link.out[: end + 1]
            changed |= self._line(link, line)
            if link.failure is not None:
                return True
        if len(link.out) > MAX_LINE:
            self._fail(link, BAD, f"a line longer than {MAX_LINE} bytes")
            return True
        return changed

    def _line(self, link: _Link, line: bytes) -> bool:
        if link.hello is None and not line.lstrip().startswith(b"{"):
            # Output of a login script before gputop started: skip a little of it.
            link.junk += 1
            if link.junk > JUNK_LINES:
                self._fail(link, BAD, f"not gputop output: {one_line(line[:80].decode('utf-8', 'replace'))}")
            return False
        try:
            message = decode_line(line)
        except WireError as exc:
            self._fail(link, BAD, str(exc))
            return True
        if isinstance(message, Hello):
            link.hello = message
            link.hello_at = time.monotonic()
            self._set(link.host, remote_hostname=message.hostname,
                      remote_version=message.version)
            return False
        if isinstance(message, StreamError):
            self._fail(link, DOWN, f"gputop stopped: {message.message}")
            return True
        if link.hello is None:
            self._fail(link, BAD, "samples before the hello line")
            return True
        assert isinstance(message, Sample)
        now = time.monotonic()
        link.last_sample = now
        if link.up_since is None:
            link.up_since = now
        elif now - link.up_since > 30.0:
            link.backoff = BACKOFF_FIRST_S  # it stayed up: the next failure retries soon
        with self._lock:
            view = self._views[link.host]
            self._recent[link.host].append(message.snapshot)
            self._views[link.host] = replace(
                view, state=UP, reason="", snapshot=message.snapshot, findings=message.findings,
                seq=view.seq + 1, last_data=now, retry_at=None,
                since=view.since if view.state == UP else now)
            self.version += 1
        return True

    def _fail(self, link: _Link, state: str, reason: str) -> None:
        """Condemn the current connection: end ssh, then retry after the backoff."""
        if link.failure is None:
            link.failure = (state, reason)
        self._terminate(link)
        if link.closed_at is None:
            link.closed_at = time.monotonic()

    def _reap(self, link: _Link, now: float) -> bool:
        """The ssh process ended (or was ended): find out why and schedule the retry."""
        proc = link.proc
        assert proc is not None
        code = proc.poll()
        if code is None:
            if link.closed_at is not None and now - link.closed_at > 2.0:
                self._kill(link)
                code = proc.poll()
            if code is None:
                return False
        # Collect what stderr still holds (it may close after stdout).
        try:
            rest = os.read(proc.stderr.fileno(), STDERR_KEEP) if not link.eof_err else b""
        except OSError:
            rest = b""
        link.err += rest
        self._unregister(link)
        link.proc = None
        state, reason = link.failure or self._why(code, link)
        self._schedule_retry(link, state, reason)
        return True

    def _why(self, code: int, link: _Link) -> tuple[str, str]:
        err = _last_line(link.err)
        if code == 255:  # ssh's own failures: unreachable, refused, auth, host key
            return DOWN, err or "ssh failed"
        if code == 127 or "command not found" in err or "No such file" in err:
            return NO_GPUTOP, err or f"{self.settings.remote_gputop}: not found on the node"
        if code == 126:
            return NO_GPUTOP, err or f"{self.settings.remote_gputop}: not executable"
        if code == 2 and "invalid choice" in err:
            return NO_GPUTOP, "the node's gputop has no `stream` command: upgrade it"
        if link.hello is None:
            return DOWN, err or f"gputop exited with status {code}"
        return DOWN, f"connection ended (status {code})" + (f": {err}" if err else "")

    def _schedule_retry(self, link: _Link, state: str, reason: str) -> None:
        delay = link.backoff * random.uniform(0.8, 1.2)
        link.backoff = min(BACKOFF_MAX_S, link.backoff * 2)
        self._set(link.host, state=state, reason=one_line(reason),
                  retry_at=time.monotonic() + delay)

    def _unregister(self, link: _Link) -> None:
        if link.proc is None:
            return
        for pipe in (link.proc.stdout, link.proc.stderr):
            try:
                self._selector.unregister(pipe)
            except (KeyError, ValueError):
                pass
            try:
                pipe.close()
            except OSError:
                pass

    def _terminate(self, link: _Link) -> None:
        if link.proc is not None and link.proc.poll() is None:
            try:
                link.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def _kill(self, link: _Link) -> None:
        if link.proc is not None and link.proc.poll() is None:
            try:
                link.proc.kill()
                link.proc.wait(1.0)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def _end_all(self, grace: float = 2.0) -> None:
        """SIGTERM every ssh (it closes its connection, and the node's gputop ends on the
        closed pipe), then SIGKILL what is left after ``grace`` seconds."""
        links = [link for link in self._links.values() if link.proc is not None]
        for link in links:
            self._terminate(link)
        deadline = time.monotonic() + grace
        for link in links:
            try:
                link.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(link)
            self._unregister(link)


def _last_line(data: bytes | bytearray) -> str:
    lines = [ln for ln in bytes(data).decode("utf-8", "replace").splitlines() if ln.strip()]
    return one_line(lines[-1]) if lines else ""
