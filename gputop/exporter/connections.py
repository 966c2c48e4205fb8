"""Bounds on the exporter's clients: how many connections at once, and how long one may take
to send its request.

These are the TLS server's (the plain-HTTP front, ``gputop.exporter.front``, keeps the same
bounds in its own loop). A thread per connection (``ThreadingWSGIServer``) keeps a slow client from holding up the
others, but without bounds a slow-loris client (a request a byte at a time, each byte just
inside the socket's timeout) holds a thread for ever, and enough of them hold every thread the
host will give. So: at most ``MAX_CONNECTIONS`` are served at once (one more is closed at
once, unread), and a request's line and headers must have arrived ``HEADER_DEADLINE_S`` after
it connected, or its socket is shut down. The deadlines are kept by one thread for all
connections (not a timer each).
"""

from __future__ import annotations

import socket
import threading
import time

MAX_CONNECTIONS = 128
HEADER_DEADLINE_S = 10.0
CHECK_EVERY_S = 0.25


class HeaderDeadlines:
    """Sockets that must have sent their request by a deadline; one thread shuts down those
    that have not (the blocked read in their own thread then ends)."""

    def __init__(self, deadline_s: float = HEADER_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._due: dict[int, tuple[float, socket.socket]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._due[id(sock)] = (time.monotonic() + self.deadline_s, sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="exporter-deadlines",
                                                daemon=True)
                self._thread.start()

    def done(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(id(sock), None)

    def stop(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._wake.wait(CHECK_EVERY_S):
            now = time.monotonic()
            with self._lock:
                late = [key for key, (due, _) in self._due.items() if due <= now]
                socks = [self._due.pop(key)[1] for key in late]
            for sock in socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # it closed meanwhile


class ConnectionSlots:
    """At most ``limit`` connections served at once."""

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        self._free = threading.BoundedSemaphore(limit)

    def take(self) -> bool:
        return self._free.acquire(blocking=False)

    def give_back(self) -> None:
        self._free.release()
