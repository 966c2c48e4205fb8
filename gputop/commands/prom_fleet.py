"""`gputop --prometheus URL` (the fleet screen, jobs first) and `gputop watch --prometheus URL`
(every node's findings with its host, and a line per job)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from gputop.core.errors import UsageError
from gputop.fleet.prometheus.jobs import NodeFinding


def run_prom_top(args: argparse.Namespace) -> int:
    client = _client(args)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the fleet view needs a terminal; for text output use "
                         "`gputop watch --json --prometheus URL`")
    from gputop.fleet.prometheus.options import filters_from_args
    from gputop.tui.fleet.prom_fleet_app import PromFleetApp

    ssh = None
    if getattr(args, "hosts", None) or getattr(args, "hostfile", None):
        from gputop.fleet.demo import fleet_from_args

        ssh = fleet_from_args(args)
    app = PromFleetApp(client, filters_from_args(args), args.interval, ssh=ssh)
    try:
        code = app.run()
    finally:
        app.monitor.stop(timeout=2.0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))


def _client(args: argparse.Namespace):
    from gputop.fleet.prometheus.options import client_from_args

    return client_from_args(args)


def _job_signature(job) -> tuple:
    return (tuple(job.nodes), len(job.gpus), tuple(sorted(f"{f.host}:{f.id}:{f.gpu}"
                                                          for f in job.findings)),
            job.straggler is not None)


def run_prom_watch(args: argparse.Namespace) -> int:
    """Findings of every node as they raise and clear (each names its host), a job line when
    a job appears or changes, and one line when Prometheus goes down and when it is back."""
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    client = _client(args)
    from gputop.fleet.prometheus.monitor import PromFleetMonitor
    from gputop.fleet.prometheus.options import filters_from_args

    news = threading.Event()
    monitor = PromFleetMonitor(client, filters_from_args(args), args.interval,
                               on_change=news.set)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    active: dict[tuple, NodeFinding] = {}
    jobs_seen: dict[str, tuple] = {}
    refreshes = 0
    down = False
    monitor.start()
    started = time.monotonic()
    try:
        while args.duration is None or time.monotonic() - started < args.duration:
            left = None if args.duration is None else args.duration - (time.monotonic()
                                                                       - started)
            news.wait(0.5 if left is None else max(0.0, min(0.5, left)))
            news.clear()
            state = monitor.state()
            now = time.time()
            if not state.ok and state.error and not down:
                down = True
                _out({"time": now, "kind": "prometheus", "state": "down",
                      "reason": state.error}, args.json,
                     f"prometheus down: {state.error} (retrying; last data kept)")
                continue
            if not state.ok or state.refreshes == refreshes:
                continue
            if down:
                down = False
                _out({"time": now, "kind": "prometheus", "state": "up"}, args.json,
                     "prometheus answers again")
            refreshes = state.refreshes
            current: dict[tuple, NodeFinding] = {}
            for node in state.nodes.values():
                for f in node.findings:
                    current[(f.instance, f.id, f.gpu)] = f
            for key, f in current.items():
                if key not in active:
                    _finding(now, f, "raised", args.json)
            for key, f in active.items():
                if key not in current:
                    _finding(now, f, "cleared", args.json)
            active = current
            for job in state.jobs:
                sig = _job_signature(job)
                if jobs_seen.get(job.key) != sig:
                    jobs_seen[job.key] = sig
                    data = {"time": now, **job.to_json()}
                    _out(data, args.json, _job_text(job))
    except KeyboardInterrupt:
        return 130
    finally:
        monitor.stop(timeout=2.0)
    return 0


def _out(data: dict, as_json: bool, text: str) -> None:
    if as_json:
        print(json.dumps(data), flush=True)
    else:
        stamp = time.strftime("%H:%M:%S", time.localtime(data["time"]))
        print(f"{stamp} {text}", flush=True)


def _finding(now: float, f, state: str, as_json: bool) -> None:
    data = {"time": now, **f.to_json(), "state": state}
    where = f" GPU {f.gpu}" if f.gpu is not None else ""
    if state == "cleared":
        text = f"{f.host}: cleared  {f.id}{where}: {f.title}"
    else:
        text = (f"{f.host}: RAISED   {f.severity} {f.id}{where}: {f.title}\n"
                f"         evidence: {f.evidence}\n         fix: {f.fix}\n"
                f"         next: {f.next_step}")
    _out(data, as_json, text)


def _job_text(job) -> str:
    util = "" if job.util_mean is None else (f", util {job.util_mean:.0f}% mean, "
                                             f"{job.util_worst:.0f}% worst")
    step = "" if job.step_time_s is None else f", step {job.step_time_s * 1e3:.0f} ms"
    spread = "" if job.step_spread is None else f" (spread {job.step_spread * 100:.0f}%)"
    straggler = f"; straggler {job.straggler}" if job.straggler else ""
    return (f"job {job.key}: {len(job.nodes)} nodes ({', '.join(job.nodes[:8])}), "
            f"{len(job.gpus)} GPUs{util}, {job.wasted_gpu_h:.2f} GPU-h wasted in the last "
            f"hour{step}{spread}, {len(job.findings)} findings{straggler}")
