"""A slow-loris on the agent's socket cannot lock out `gputop capture` (issue 27, acceptance 5).

Twenty connections each send one byte of a request every 2 s, and reconnect as soon as they
are cut. The agent bounds each request's total time (``REQUEST_TIMEOUT_S``), not the gap between
its bytes, and gives a handler slot only to a whole request: the capture of the job works as
it does without them, and status requests are answered meanwhile.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from gputop.agent.server import REQUEST_TIMEOUT_S
from gputop.client import agents as client
from tests.conftest import REPO, SLOW, cli_env, wait_for

pytestmark = pytest.mark.timeout(8 * SLOW)

CONNECTIONS = 20
BYTE_EVERY_S = 2.0


class SlowLoris:
    """CONNECTIONS threads, each trickling a request one byte every BYTE_EVERY_S."""

    def __init__(self, pid: int) -> None:
        self.path = str(client.find_agent(pid))
        self.stop = threading.Event()
        self.lifetimes: list[float] = []  # how long each cut connection had lasted
        self.threads = [threading.Thread(target=self._trickle, daemon=True)
                        for _ in range(CONNECTIONS)]

    def __enter__(self) -> SlowLoris:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(SLOW)

    def _trickle(self) -> None:
        request = b'{"cmd": "status"}\n'
        while not self.stop.is_set():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.path)
                opened = time.monotonic()
                for i in range(len(request) - 1):  # never the newline
                    try:
                        s.sendall(request[i:i + 1])
                    except OSError:
                        break  # cut
                    if self.stop.wait(BYTE_EVERY_S):
                        return
                    if _cut(s):
                        break
                self.lifetimes.append(time.monotonic() - opened)


def _cut(s: socket.socket) -> bool:
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def capture(pid: int) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gputop", "capture", str(pid), "--steps", "2",
                           "--no-with-stack", "--json"], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=4 * SLOW)
    return time.monotonic() - started, done


def test_slow_loris_leaves_capture_working(steady_agent_job):
    pid = steady_agent_job.pid
    wait_for(lambda: (client.agent_status(pid) or {}).get("steps"), timeout=SLOW)
    normal, done = capture(pid)
    assert done.returncode == 0, done.stdout + done.stderr
    with SlowLoris(pid) as loris:
        time.sleep(2 * BYTE_EVERY_S)  # every connection open and trickling
        status = client.agent_status(pid, timeout=5.0)
        assert status is not None and status["ok"]
        under_attack, done = capture(pid)
        assert done.returncode == 0, done.stdout + done.stderr
        assert '"trace"' in done.stdout
        # Each trickling connection is cut once its request has taken REQUEST_TIMEOUT_S.
        wait_for(lambda: len(loris.lifetimes) >= CONNECTIONS, timeout=SLOW)
    print(f"\ncapture of 2 steps: {normal:.1f} s alone, {under_attack:.1f} s beside "
          f"{CONNECTIONS} slow-loris connections; those were cut after "
          f"{min(loris.lifetimes):.1f}-{max(loris.lifetimes):.1f} s")
    # Cut by the request's deadline, not kept alive by the trickle (a byte every 2 s).
    assert max(loris.lifetimes) < REQUEST_TIMEOUT_S + 3 * BYTE_EVERY_S + 10, loris.lifetimes
