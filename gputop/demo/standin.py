"""A stand-in training process for the demo, whose real CPU behaviour matches its scenario.

Run as ``python -m gputop.demo.standin KIND --workers N --parent PID``:

* ``trainer``: a healthy job: the main process busy ~15 %, workers lightly loaded;
* ``starved``: the main process waits on its DataLoader-like workers, each of which burns a core;
* ``busy``: the main process is CPU-bound (a whole core) with no workers: Python between steps,
  or a thread launching kernel after kernel;
* ``sync``: the main process blocks (asleep) while its GPU works and runs while it idles, on the
  simulated driver's clock (``--origin``): a loop that waits in a sync every step;
* ``idle``: nothing runs (a job waiting on I/O or a peer).

Every process here dies with its parent (PR_SET_PDEATHSIG, plus a parent-pid check), so a demo
never leaves CPU burners behind, even when gputop is killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15

# (busy seconds, idle seconds) per cycle for each process role.
DUTY = {
    "trainer": (0.015, 0.085),
    "trainer-worker": (0.005, 0.095),
    "starved-worker": (1.0, 0.0),
    "busy": (0.1, 0.0),
}


def _die_with_parent(parent: int, name: bytes) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent-pid check below still ends us
    if os.getppid() != parent:
        os._exit(0)  # the parent died before the signal was armed


def _spin(busy: float, idle: float, parent: int, notify: int | None = None) -> None:
    """Burn ``busy`` seconds of CPU, sleep ``idle``, forever; leave when the parent is gone."""
    x = 0
    while True:
        end = time.perf_counter() + busy
        while time.perf_counter() < end:
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF  # pure-Python work: a "transform"
        if notify is not None:
            try:
                os.write(notify, b".")
            except OSError:
                os._exit(0)
        if idle:
            time.sleep(idle)
        if os.getppid() != parent:
            os._exit(0)


def _take_turns(origin: float, parent: int) -> None:
    """Asleep while the simulated GPU works (blocked in a sync), burning CPU while it idles (the
    host's work between syncs), on the simulated driver's clock, which started at ``origin``
    (time.monotonic: one clock for every process of the machine)."""
    from gputop.sim.scenarios import HOST_SYNC_BUSY, HOST_SYNC_PERIOD

    x = 0
    while os.getppid() == parent:
        into = (time.monotonic() - origin) % HOST_SYNC_PERIOD
        if into < HOST_SYNC_BUSY * HOST_SYNC_PERIOD:
            time.sleep(HOST_SYNC_BUSY * HOST_SYNC_PERIOD - into)
            continue
        end = time.monotonic() + HOST_SYNC_PERIOD - into
        while time.monotonic() < end:
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _fork_worker(role: str, parent: int) -> tuple[int, int | None]:
    read_end, write_end = os.pipe() if role == "starved-worker" else (None, None)
    pid = os.fork()
    if pid == 0:
        _die_with_parent(parent, b"demo-loader")
        if read_end is not None:
            os.close(read_end)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _spin(*DUTY[role], parent=parent, notify=write_end)
        os._exit(0)
    if write_end is not None:
        os.close(write_end)
    return pid, read_end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gputop-demo-standin")
    parser.add_argument("kind", choices=["trainer", "starved", "busy", "sync", "idle"])
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--origin", type=float, default=None,
                        help="time.monotonic() when the simulated driver's clock started")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent, f"demo-{args.kind}".encode())

    workers: list[int] = []

    def stop(*_):
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    me = os.getpid()
    pipes = []
    for _ in range(args.workers):
        pid, pipe = _fork_worker(f"{'starved' if args.kind == 'starved' else 'trainer'}-worker", me)
        workers.append(pid)
        if pipe is not None:
            pipes.append(pipe)
    if args.kind == "starved":
        # Wait for batches from the workers, like a training loop blocked in next(loader).
        while os.getppid() == args.parent:
            ready, _, _ = select.select(pipes, [], [], 1.0)
            for fd in ready:
                os.read(fd, 4096)
    elif args.kind in ("trainer", "busy"):
        _spin(*DUTY[args.kind], parent=args.parent)
    elif args.kind == "sync":
        _take_turns(args.origin if args.origin is not None else time.monotonic(), args.parent)
    else:
        while os.getppid() == args.parent:
            time.sleep(0.5)
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
