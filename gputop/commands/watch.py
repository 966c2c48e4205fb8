"""`gputop watch`: headless diagnosis; print each finding as it raises and clears."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "watch",
        parents=[common],
        help="headless: print findings as they raise and clear (for cluster jobs and alerting)",
        description="Sample every --interval and run the live rules; print a line when a finding "
        "raises and when it clears. Exits 0 after --duration, 130 on Ctrl-C. The rules and the "
        "fields: docs/watch.md.",
    )
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: time, host, gpu, pid, job, rank, id, "
                        "severity, title, evidence, fix, next_step, state (raised | cleared | "
                        "where, the last with a where field); with --hosts, host is the node "
                        "and node lines carry state (down, up, ...) and reason (docs/watch.md)")
    p.add_argument("--duration", type=float, metavar="S", default=None,
                   help="stop after S seconds (default: run until interrupted)")
    p.add_argument("--no-where", action="store_true",
                   help="do not sample the Python stacks (py-spy) of a process with a "
                        "dataloader-stall, host-bound, host-sync, hung or cpu-contention finding to "
                        "print where "
                        "it is")


def run(args: argparse.Namespace) -> int:
    from gputop.fleet.options import requested as fleet_requested
    from gputop.fleet.prometheus.options import prometheus_requested

    if prometheus_requested(args):  # every node's findings and the jobs, from Prometheus
        from gputop.commands.prom_fleet import run_prom_watch

        return run_prom_watch(args)
    if fleet_requested(args):  # --hosts and the like: the findings of every node
        from gputop.commands.fleet import run_fleet_watch

        return run_fleet_watch(args)
    # Imported here: every command module is loaded to build --help, so keep those light.
    from gputop.client.session import open_sampler, sample_every
    from gputop.diagnostics.live.lines import format_where, transition_line
    from gputop.diagnostics.live.mig import LiveDiagnosis  # MIG devices one by one

    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    # SIGTERM (a job scheduler stopping us) ends the loop like Ctrl-C, with cleanup.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    diagnosis = LiveDiagnosis()
    where = None if getattr(args, "no_where", False) else _where_finder()
    try:
        with open_sampler(args.demo, args.gpus, args.seed) as sampler:
            if not sampler.driver.available:
                print(f"gputop: {sampler.driver.error}; only host-side rules can run "
                      "(try --demo tour)", file=sys.stderr)
            host = sampler.host.hostname
            for snap in sample_every(sampler, args.interval, args.duration):
                for transition in diagnosis.update(snap):
                    print(transition_line(transition, host, args.json), flush=True)
                # A raised stall's stacks are sampled in the background: once they say
                # where, one more line for that finding.
                for found in where.update(diagnosis.findings()) if where is not None else ():
                    if args.json:
                        print(json.dumps({"time": snap.time, "host": host, "state": "where",
                                          **found.to_json()}), flush=True)
                    else:
                        print(format_where(found, snap.time), flush=True)
    except KeyboardInterrupt:
        return 130
    finally:
        if where is not None:
            where.close()
    return 0


def _where_finder():
    """Where lines for stalls and hangs (py-spy), when py-spy is installed."""
    from gputop.stacks.pyspy import find_py_spy
    from gputop.stacks.where import WhereFinder

    return WhereFinder() if find_py_spy() is not None else None
