"""`gputop watch`: headless diagnosis; print each finding as it raises and clears."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import TYPE_CHECKING

from gputop.errors import UsageError

if TYPE_CHECKING:
    from gputop.diagnostics.live import Transition


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "watch",
        parents=[common],
        help="headless: print findings as they raise and clear (for cluster jobs and alerting)",
        description="Sample every --interval and run the live rules; print a line when a finding "
        "raises and when it clears. Exits 0 after --duration, 130 on Ctrl-C.",
    )
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: time, host, gpu, pid, id, severity, title, "
                        "evidence, fix, next_step, state (raised | cleared); with --hosts, "
                        "host is the node and node lines carry state (down, up, ...) and reason")
    p.add_argument("--duration", type=float, metavar="S", default=None,
                   help="stop after S seconds (default: run until interrupted)")


def format_transition(t: Transition) -> str:
    f = t.finding
    stamp = time.strftime("%H:%M:%S", time.localtime(t.time))
    where = " ".join(x for x in (f"GPU {f.gpu}" if f.gpu is not None else "",
                                 f"pid {f.pid}" if f.pid is not None else "") if x)
    if t.state == "cleared":
        return f"{stamp} cleared  {f.id} {where}: {f.title}"
    return (f"{stamp} RAISED   {f.severity} {f.id} {where}: {f.title}\n"
            f"         evidence: {f.evidence}\n"
            f"         fix: {f.fix}\n"
            f"         next: {f.next_step}")


def run(args: argparse.Namespace) -> int:
    from gputop.fleet.cli import fleet_requested, run_fleet_watch

    if fleet_requested(args):  # --hosts and the like: the findings of every node
        return run_fleet_watch(args)
    # Imported here: every command module is loaded to build --help, so keep those light.
    from gputop.diagnostics.live import LiveDiagnosis
    from gputop.session import open_sampler, sample_every

    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    # SIGTERM (a job scheduler stopping us) ends the loop like Ctrl-C, with cleanup.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    diagnosis = LiveDiagnosis()
    try:
        with open_sampler(args.demo, args.gpus, args.seed) as sampler:
            if not sampler.driver.available:
                print(f"gputop: {sampler.driver.error}; only host-side rules can run "
                      "(try --demo tour)", file=sys.stderr)
            host = sampler.host.hostname
            for snap in sample_every(sampler, args.interval, args.duration):
                for transition in diagnosis.update(snap):
                    if args.json:
                        print(json.dumps(transition.to_json(host)), flush=True)
                    else:
                        print(format_transition(transition), flush=True)
    except KeyboardInterrupt:
        return 130
    return 0
