"""`gputop stream`: headless, for another machine to read: snapshots and findings as JSON lines.

This is what `gputop --hosts ...` runs on every node over ssh (the schema is in
``gputop.fleet.wire``). It listens on nothing: it writes to its stdout until the reader goes
away (a closed pipe ends it quietly), SIGTERM or SIGHUP arrives, or --duration passes.
"""

from __future__ import annotations

import argparse
import signal
import sys

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "stream",
        parents=[common],
        help="headless: one JSON line per interval with the snapshot and the active findings "
             "(what `gputop --hosts` reads from each node over ssh)",
        description="Write a hello line, then every --interval one JSON line with the "
        "snapshot (the `snapshot --json` schema) and the active findings of the live rules. "
        "Schema 1, documented in docs/fleet.md. Nothing listens on a port: the "
        "output goes to stdout, and the command ends when its reader goes away.",
    )
    p.add_argument("--duration", type=float, metavar="S", default=None,
                   help="stop after S seconds (default: run until the reader goes away)")


def _leave(*_: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    import socket

    from gputop import __version__
    from gputop.client.session import open_sampler, sample_every
    from gputop.diagnostics.live.mig import LiveDiagnosis  # MIG devices one by one
    from gputop.fleet.wire import error_line, hello_line, sample_line

    # SIGTERM, or SIGHUP when the ssh session goes, ends the loop with cleanup (the demo's
    # stand-ins are stopped on the way out).
    signal.signal(signal.SIGTERM, _leave)
    signal.signal(signal.SIGHUP, _leave)
    out = sys.stdout.buffer
    # At once, before NVML opens: the reader learns that gputop runs there and which schema.
    out.write(hello_line(socket.gethostname(), args.interval, __version__, args.demo))
    out.flush()
    diagnosis = LiveDiagnosis()
    try:
        with open_sampler(args.demo, args.gpus, args.seed) as sampler:
            for snap in sample_every(sampler, args.interval, args.duration):
                diagnosis.update(snap)
                out.write(sample_line(snap, diagnosis.findings()))
                out.flush()
    except KeyboardInterrupt:
        return 0
    except (BrokenPipeError, UsageError):
        raise
    except Exception as exc:  # the reader shows it as the node's state: one line
        try:
            out.write(error_line(f"{type(exc).__name__}: {exc}"))
            out.flush()
        except OSError:
            pass
        print(f"gputop: error: {exc}", file=sys.stderr)
        return 1
    return 0
