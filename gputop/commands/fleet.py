"""`gputop --hosts ...` (the fleet screen) and `gputop watch --hosts ...` (for scripts).

The live monitor and `watch` hand over to this module when a --hosts, --hostfile or --slurm
option is given; no other command takes them. A command, not part of ``gputop.fleet``: it
draws with ``gputop.tui.fleet.fleet_app``, which sits above the fleet's monitor.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from gputop.core.errors import UsageError
from gputop.fleet.demo import fleet_from_args


def run_fleet_top(args: argparse.Namespace) -> int:
    hosts, settings = fleet_from_args(args)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the fleet view needs a terminal; for text output use "
                         "`gputop watch --json --hosts ...`")
    from gputop.tui.fleet.fleet_app import FleetApp

    app = FleetApp(hosts, settings, args.interval,
                   frame_log=os.environ.get("GPUTOP_FLEET_LOG"))
    try:
        code = app.run()
    finally:
        app.monitor.stop(timeout=5.0)  # every ssh ended before we leave
    sys.stdout.flush()
    sys.stderr.flush()
    # As the single-node monitor: skip the slow interpreter teardown after Textual.
    os._exit(int(code or 0))


def _print(data: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data), flush=True)
        return
    stamp = time.strftime("%H:%M:%S", time.localtime(data["time"]))
    host = data["host"]
    if "id" not in data:
        reason = f": {data['reason']}" if data.get("reason") else ""
        print(f"{stamp} {host}: node {data['state']}{reason}", flush=True)
        return
    where = " ".join(x for x in (f"GPU {data['gpu']}" if data["gpu"] is not None else "",
                                 f"pid {data['pid']}" if data["pid"] is not None else "") if x)
    if data["state"] == "cleared":
        print(f"{stamp} {host}: cleared  {data['id']} {where}: {data['title']}", flush=True)
        return
    print(f"{stamp} {host}: RAISED   {data['severity']} {data['id']} {where}: {data['title']}\n"
          f"         evidence: {data['evidence']}\n"
          f"         fix: {data['fix']}\n"
          f"         next: {data['next_step']}", flush=True)


def run_fleet_watch(args: argparse.Namespace) -> int:
    """Findings of every node as they raise and clear (each line names its host), and nodes
    as they go down and come back."""
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    hosts, settings = fleet_from_args(args)
    from gputop.fleet.monitor import FleetMonitor

    news = threading.Event()
    monitor = FleetMonitor(hosts, settings, args.interval, on_change=news.set)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    active: dict[str, dict[tuple, object]] = {h: {} for h in hosts}
    states: dict[str, str] = {}
    seen: dict[str, int] = {}
    monitor.start()
    started = time.monotonic()
    try:
        while args.duration is None or time.monotonic() - started < args.duration:
            news.wait(0.5)
            news.clear()
            now = time.time()
            for view in monitor.views():
                host = view.host
                # Node lines: a change of state, not each retry ("connecting" is passing),
                # and not the first sight of a node that is fine.
                if view.state != "connecting" and view.state != states.get(host):
                    first = host not in states
                    states[host] = view.state
                    if not (first and view.state == "up"):
                        _print({"time": now, "host": host, "state": view.state,
                                "reason": view.reason}, args.json)
                if not view.live or view.seq == seen.get(host):
                    continue
                seen[host] = view.seq
                current = {(f.id, f.gpu, f.pid): f for f in view.findings}
                for key, f in current.items():
                    if key not in active[host]:
                        _print(_finding_line(now, host, f, "raised"), args.json)
                for key, f in active[host].items():
                    if key not in current:
                        _print(_finding_line(now, host, f, "cleared"), args.json)
                active[host] = current
    except KeyboardInterrupt:
        return 130
    finally:
        monitor.stop(timeout=5.0)
    return 0


def _finding_line(now: float, host: str, f, state: str) -> dict:
    return {"time": now, "host": host, "gpu": f.gpu, "pid": f.pid, "id": f.id,
            "severity": f.severity, "title": f.title, "evidence": f.evidence, "fix": f.fix,
            "next_step": f.next_step, "cost_s": f.cost_s, "state": state}
