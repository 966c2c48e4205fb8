"""A stand-in for `gputop stream` on one simulated node of benchmarks/bench_fleet.py.

32 real gputop demos do not fit on a small machine, so each node replays the lines of one real
`gputop --demo tour stream` recording (8 GPUs, their processes and findings), one per interval
with fresh times, and at the time the benchmark schedules for it (in a file it re-reads when it changes) adds one new finding and
writes down when that line went out. The node's name comes from GPUTOP_NODE_SCENARIO (set by
its sshd, or by the local ssh stand-in).

Usage: fleet_standin.py --lines REC --schedule JSON --log FILE [--interval S] stream
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", required=True)
    parser.add_argument("--schedule", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("rest", nargs="*")
    args, _ = parser.parse_known_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    node = os.environ.get("GPUTOP_NODE_SCENARIO", "node")
    with open(args.lines, encoding="utf-8") as f:
        recorded = [json.loads(line) for line in f if line.strip()]
    hello, samples = recorded[0], recorded[1:]
    raise_at, rank, seen_mtime = None, 0, None
    out = sys.stdout
    hello["hostname"] = node
    raised = False
    try:
        out.write(json.dumps(hello, ensure_ascii=False) + "\n")
        out.flush()
        tick = time.monotonic()
        i = 0
        while True:
            sample = samples[i % len(samples)]
            i += 1
            # The schedule is written once every node is up: look at it again when it changes.
            mtime = os.stat(args.schedule).st_mtime_ns
            if mtime != seen_mtime:
                seen_mtime = mtime
                with open(args.schedule, encoding="utf-8") as f:
                    mine = json.load(f).get(node, {})
                raise_at, rank = mine.get("time"), mine.get("rank", 0)
            now = time.time()
            sample["time"] = sample["snapshot"]["time"] = now
            sample["snapshot"]["host"]["hostname"] = node
            findings = list(sample["findings"])
            if raise_at is not None and now >= raise_at:
                findings.insert(0, {"id": "hung", "severity": "critical",
                                    "title": f"bench raise on {node}",
                                    "evidence": "injected by benchmarks/bench_fleet.py",
                                    "fix": "none", "next_step": "none",
                                    "cost_s": 1e6 + rank, "gpu": 7, "pid": None})
            # Raw UTF-8, as gputop stream writes it (msgspec), not \\u escapes.
            out.write(json.dumps({**sample, "findings": findings}, ensure_ascii=False) + "\n")
            out.flush()
            if findings and findings[0]["id"] == "hung" and not raised:
                raised = True
                with open(args.log, "a", encoding="utf-8") as log:
                    log.write(f"{time.time():.4f} {node}\n")
            tick += args.interval
            time.sleep(max(0.0, tick - time.monotonic()))
    except (BrokenPipeError, KeyboardInterrupt):
        os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
