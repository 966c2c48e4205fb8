"""Per-rank communication of one multi-rank job: gputop analyze vs Holistic Trace Analysis.

Runs ``gputop analyze --json`` on every rank's trace of a job (default: the DLRM 8-rank job in
``../shared/traces``, dlrm8_rank0..7) and HTA's ``get_comm_comp_overlap`` on the same files,
each in a fresh process, and prints per rank: gputop's exposed communication (collective time
no compute hides) and its split into waiting for a late rank and moving data, gputop's
comm/comp overlap and HTA's, and their difference (HTA's definition: the share of the rank's
communication kernel time that overlaps computation kernels). Then the straggler gputop names
and the wall time and peak RSS of both tools. HTA has no straggler or waiting split to compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"

HTA = """
import json, os, sys, tempfile, warnings
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
result, traces = sys.argv[1], sys.argv[2:]
with tempfile.TemporaryDirectory() as d:
    # HTA reads a directory of traces, one per rank.
    for t in traces:
        os.symlink(os.path.abspath(t), os.path.join(d, os.path.basename(t)))
    overlap = TraceAnalysis(trace_dir=d).get_comm_comp_overlap(visualize=False)
    with open(result, "w") as fh:
        json.dump({str(int(r)): float(p) for r, p in
                   zip(overlap["rank"], overlap["comp_comm_overlap_pctg"])}, fh)
"""


def timed(cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, float, float]:
    """The finished command, its wall seconds and its own peak RSS in MiB (from wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
    return done, wall, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path,
                        help=f"every rank's trace of one job (default: dlrm8_rank*.json.gz in "
                             f"{TRACES})")
    args = parser.parse_args()
    traces = args.traces or sorted(TRACES.glob("dlrm8_rank*.json.gz"))
    if len(traces) < 2:
        print(f"give two or more ranks' traces (none found in {TRACES})", file=sys.stderr)
        return 2
    if importlib.util.find_spec("hta") is None:
        print("Holistic Trace Analysis is not installed: pip install 'gputop[bench]'",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))

    ours, our_wall, our_rss = timed(
        [sys.executable, "-m", "gputop", "analyze", "--json", *map(str, traces)], env)
    if ours.returncode != 0:
        print(f"gputop analyze failed: {ours.stderr.strip()[-300:]}", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in ours.stdout.splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as d:
        result = Path(d) / "hta.json"
        hta, hta_wall, hta_rss = timed(
            [sys.executable, "-c", HTA, str(result), *map(str, traces)], env)
        if hta.returncode != 0:
            print(f"HTA failed: {hta.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
        theirs = json.loads(result.read_text())

    cross = next((r["cross_rank"] for r in rows if r.get("cross_rank")), None)
    by_rank = {c["rank"]: c for c in (cross or {}).get("ranks", [])}
    print(f"{len(traces)} ranks; per step: exposed communication, of it waiting for a late rank "
          "and moving data; comm/comp overlap (% of communication kernel time)\n")
    print(f"{'rank':>4}  {'exposed':>9}  {'waiting':>9}  {'bandwidth':>9}  {'gputop':>7}  "
          f"{'HTA':>7}  {'diff':>6}")
    worst = 0.0
    for row in rows:
        rank = row["metrics"]["trace"]["rank"]
        comm = row["metrics"]["communication"]
        c = by_rank.get(rank, {})
        hta_pct = theirs.get(str(rank))
        diff = abs(comm["overlap_pct"] - hta_pct) if hta_pct is not None else float("nan")
        worst = max(worst, diff) if hta_pct is not None else worst
        print(f"{rank:>4}  {c.get('exposed_comm_ms', float('nan')):>6.2f} ms  "
              f"{c.get('exposed_waiting_for_late_rank_ms', float('nan')):>6.2f} ms  "
              f"{c.get('exposed_bandwidth_ms', float('nan')):>6.2f} ms  "
              f"{comm['overlap_pct']:>6.2f}%  "
              f"{hta_pct if hta_pct is not None else float('nan'):>6.2f}%  {diff:>5.2f}")
    print(f"\nworst overlap difference: {worst:.2f} points (acceptance: within 2)")
    s = (cross or {}).get("straggler")
    if s:
        print(f"gputop's straggler: {s['label']} (score {s['score']}, cause {s['cause']}); the "
              f"others wait {s['others_wait_ms_per_step']} ms per step for it. HTA: none named.")
    else:
        print("gputop names no straggler. HTA: none named.")
    print(f"wall: gputop {our_wall:.2f} s, HTA {hta_wall:.2f} s ({hta_wall / our_wall:.1f}x "
          f"gputop's); peak RSS: gputop {our_rss:.0f} MiB, HTA {hta_rss:.0f} MiB")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
