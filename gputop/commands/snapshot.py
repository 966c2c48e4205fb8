"""`gputop snapshot`: one sample of GPUs, host and training processes, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from gputop.core.snapshot_text import format_snapshot

if TYPE_CHECKING:
    from gputop.core.model import Snapshot

NO_DRIVER_HINT = "try `gputop --demo tour snapshot` to see gputop on simulated GPUs"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "snapshot",
        parents=[common],
        help="print one sample of GPUs, host and training processes, then exit",
        description="Sample GPUs, the host and the GPU processes with their DataLoader workers "
        "once and print a table, or JSON with --json (schema in docs/monitor.md). It does not "
        "wait to measure rates: a process's CPU % is its average since it started (as ps shows "
        "it), the host's is measured over the time the command runs; --measure S measures "
        "both over S seconds instead.",
    )
    p.add_argument("--json", action="store_true", help="print the public JSON schema")
    p.add_argument("--measure", type=float, default=0.0, metavar="SECONDS",
                   help="measure CPU %% over this many seconds (default 0: no wait)")


# The host's CPU % needs some time between its two readings of the kernel's counters (they
# advance in 10 ms ticks per core): the command's own start-up usually gives it this much.
HOST_WINDOW_S = 0.1


WORKERS_WAIT_S = 90.0


def take_snapshot(args: argparse.Namespace) -> Snapshot:
    from gputop.client.session import open_sampler  # here: keeps `gputop --help` light
    from gputop.collect.host import HostCollector

    measure = max(0.0, min(float(getattr(args, "measure", 0.0) or 0.0), 60.0))
    started = time.monotonic()
    host = HostCollector(lifetime_first=not measure)  # primes the host's counters now
    # A demo's one-shot snapshot starts the plain stand-ins, not the torch trainer: it would
    # take seconds to import torch, and its agent would have no step to report yet (with
    # --measure it has time to). The simulated GPUs read as jobs past their start-up (one
    # reading during it shows nothing).
    from gputop.sim.scenarios import STARTUP_S

    # Measuring, the demo's window starts once its trainer has forked its workers: its agent
    # answers by then, so its energy per step has a reading at both ends of the window (torch's
    # import alone can take over 10 s on a busy machine, a minute at a load of 40 on 2 cores;
    # the wait ends at once when the trainer is ready, or has ended).
    with open_sampler(args.demo, args.gpus, args.seed, wait_for_workers=max(WORKERS_WAIT_S, measure),
                      host=host, trainer=bool(measure), demo_elapsed=STARTUP_S + 1.0) as sampler:
        if measure:
            sampler.sample()  # the processes' counters start here
            time.sleep(measure)
        else:
            time.sleep(max(0.0, HOST_WINDOW_S - (time.monotonic() - started)))
        return sampler.sample()


def run(args: argparse.Namespace) -> int:
    snap = take_snapshot(args)
    if not snap.driver.available:
        print(f"gputop: {snap.driver.error}; {NO_DRIVER_HINT}", file=sys.stderr)
    if args.json:
        from gputop.core.snapshot_json import snapshot_to_json

        print(json.dumps(snapshot_to_json(snap)))
    else:
        print(format_snapshot(snap))
    return 0
