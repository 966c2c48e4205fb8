"""Another user's agent sockets that accept and never answer: what a user could leave for
root's monitor to wait on.

Run as root with ``--uid UID --count N``: it drops to that uid, then forks N processes, each
listening on ``/tmp/gputop-UID/<its pid>.sock`` (the user's agent directory; the name and
SO_PEERCRED match, as a real agent's do). Each accepts every connection and holds it open,
reading nothing and answering nothing. Prints ``ready PID...`` once all listen; the children
die with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys
import time

PR_SET_PDEATHSIG = 1


def hold(directory: str) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    path = os.path.join(directory, f"{os.getpid()}.sock")
    staging = os.path.join(directory, f".{os.getpid()}.tmp")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(staging)
    server.listen(64)
    os.rename(staging, path)  # the name appears once it listens, as an agent's does
    held = []
    while True:
        conn, _ = server.accept()
        held.append(conn)  # never read, never answered, never closed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--count", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(args.uid)
        os.setuid(args.uid)
    directory = f"/tmp/gputop-{args.uid}"
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    children = []
    for _ in range(args.count):
        pid = os.fork()
        if pid == 0:
            try:
                hold(directory)
            finally:
                os._exit(1)
        children.append(pid)
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(directory, f"{pid}.sock")) for pid in children):
        if time.monotonic() > deadline:
            return 1
        time.sleep(0.02)
    print("ready", *children, flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


if __name__ == "__main__":
    sys.exit(main())
