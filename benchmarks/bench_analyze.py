"""Benchmark `gputop analyze` against Holistic Trace Analysis on the same real traces.

Every run is a fresh Python process, so wall time and peak memory include interpreter start-up,
imports and parsing: what a user waits for. For each trace it runs

- ``gputop analyze --json TRACE``: the CLI as users run it;
- the gputop engine alone: ``diagnostics.trace.analyze_trace`` in a bare interpreter (what
  ``gputop capture`` runs after a capture), which shows the CLI's own start-up cost apart;
- Holistic Trace Analysis: its temporal breakdown and idle-time breakdown, in an environment
  HTA supports: HTA 0.5 fails on pandas 3 (an int16 dtype error on some traces), so it runs in a
  virtual environment of its own with ``holistictraceanalysis==0.5.0`` and ``pandas<3``, which
  this script creates on first use (about 2 minutes, 0.5 GB; in ``$GPUTOP_HTA_VENV``, default
  ``~/.cache/gputop/hta-venv``; ``--hta-python`` names an interpreter that has HTA instead),

``--repeat`` times each, interleaved, and prints the best wall time (as timeit does: background
load only ever adds time), the median peak RSS, the ratios, and both GPU-idle percentages
(gputop's ``metrics.temporal.idle_pct`` is defined as HTA's ``idle_time_pctg``; traces without
GPU activity have none). The summary gives the geometric-mean ratios over every trace both tools
analysed and names every trace HTA could not read, with HTA's error.
Goal: at least 5x faster, at most half the memory, idle within 2 points.

    python benchmarks/bench_analyze.py [TRACE ...] [--repeat N] [--hta-python PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"

ENGINE = """
import json, sys
from gputop.diagnostics.trace.analysis import analyze_trace
a = analyze_trace(sys.argv[1])
with open(sys.argv[2], "w") as fh:
    json.dump({"idle": a.metrics.get("temporal", {}).get("idle_pct"),
               "gpu": a.metrics["trace"]["gpu_activity"], "verdict": a.verdict}, fh)
"""
# HTA's own environment: the release measured, on the pandas it supports.
HTA_REQUIREMENTS = ("holistictraceanalysis==0.5.0", "pandas<3")
HTA_VENV = Path(os.environ.get("GPUTOP_HTA_VENV")
                or Path.home() / ".cache" / "gputop" / "hta-venv")

HTA = """
import json, os, sys, tempfile, warnings
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
trace, result = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as d:
    # HTA reads a directory of traces; give it one holding just this file.
    os.symlink(os.path.abspath(trace), os.path.join(d, os.path.basename(trace)))
    analyzer = TraceAnalysis(trace_dir=d)
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    rank = int(temporal["rank"].iloc[0])
    idle, _ = analyzer.get_idle_time_breakdown(ranks=[rank], visualize=False)
    with open(result, "w") as fh:
        json.dump({"idle": float(temporal["idle_time_pctg"].iloc[0]), "rank": rank}, fh)
"""

# Peak RSS is taken by a tiny launcher, not by this process: on Linux a child's ru_maxrss
# includes the image it was forked from, so the measured program must be forked from a small
# process. The launcher (no site, no subprocess module) is a few MiB; both tools pay it.
LAUNCHER = """
import json, os, sys, time
cmd, report = json.loads(sys.argv[1]), sys.argv[2]
start = time.perf_counter()
pid = os.posix_spawn(cmd[0], cmd, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(report, "w") as fh:
    json.dump({"wall": wall, "rss_kib": usage.ru_maxrss,
               "code": os.waitstatus_to_exitcode(status)}, fh)
"""


def measured(cmd: list[str], env: dict) -> dict:
    """Run ``cmd`` through the launcher: wall seconds, peak RSS MiB, exit code, stdout, and the
    last line of stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        report, out, err = (Path(tmp) / n for n in ("report.json", "out", "err"))
        with out.open("wb") as fo, err.open("wb") as fe:
            subprocess.run(
                [sys.executable, "-S", "-c", LAUNCHER, json.dumps(cmd), str(report)],
                stdout=fo,
                stderr=fe,
                env=env,
                cwd=REPO,
                check=True,
            )
        r = json.loads(report.read_text())
        tail = err.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return {
            "wall": r["wall"],
            "rss": r["rss_kib"] / 1024,
            "ok": r["code"] == 0,
            "stdout": out.read_text(errors="replace"),
            "error": tail[0],
        }


def hta_python(venv: Path = HTA_VENV) -> Path:
    """The interpreter of HTA's environment, created on first use (``HTA_REQUIREMENTS``)."""
    python = venv / "bin" / "python"
    stamp = venv / ".gputop-requirements"
    wanted = "\n".join(HTA_REQUIREMENTS)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"bench_analyze: creating HTA's environment in {venv} ({', '.join(HTA_REQUIREMENTS)}; "
          "first use only, a few minutes)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", *HTA_REQUIREMENTS],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        raise SystemExit(f"bench_analyze: could not install {' '.join(HTA_REQUIREMENTS)}:\n"
                         + "\n".join(pip.stderr.splitlines()[-5:]))
    stamp.write_text(wanted)
    return python


def hta_version(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m, pandas; print("
                          "m.version('holistictraceanalysis'), pandas.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    return f"{out[0]} (pandas {out[1]})"


def run_tool(tool: str, trace: Path, env: dict, hta: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        if tool == "cli":
            cmd = [sys.executable, "-m", "gputop", "analyze", "--json", str(trace)]
        elif tool == "engine":
            cmd = [sys.executable, "-c", ENGINE, str(trace), str(result)]
        else:
            cmd = [str(hta), "-c", HTA, str(trace), str(result)]
        row = measured(cmd, env)
        if row["ok"] and tool == "cli":
            metrics = json.loads(row["stdout"])["metrics"]
            row["idle"] = metrics.get("temporal", {}).get("idle_pct")
            row["gpu"] = metrics["trace"]["gpu_activity"]
            row["events"] = metrics["trace"]["events"]
        elif row["ok"]:
            row.update(json.loads(result.read_text()))
        return row


def best_of(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ok"]]
    if not ok:
        return {"ok": False, "error": rows[-1]["error"]}
    out = dict(ok[-1])
    out["wall"] = min(r["wall"] for r in ok)
    out["rss"] = statistics.median(r["rss"] for r in ok)
    return out


def fmt_idle(row: dict) -> str:
    if row.get("gpu") is False or row.get("idle") is None:
        return "n/a (no GPU)"
    return f"{row['idle']:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, help=f"default: all in {TRACES}")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and trace")
    parser.add_argument("--hta-python", type=Path, default=None, metavar="PATH",
                        help="a Python that has HTA (default: HTA's own environment, "
                        f"created on first use in {HTA_VENV})")
    args = parser.parse_args()
    traces = args.traces or sorted(p for p in TRACES.glob("*.json*") if p.is_file())
    if not traces:
        print(f"no traces given and none in {TRACES}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    hta = args.hta_python or hta_python()
    baseline = measured([sys.executable, "-c", "pass"], env)

    print(f"gputop analyze vs Holistic Trace Analysis {hta_version(hta)}, a fresh process per "
          "run:")
    print(f"best wall time of {args.repeat} interleaved runs (start-up, imports and parsing")
    print("included) and median peak RSS.")
    print(
        f"Load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; an empty "
        f"Python start-up here: {baseline['wall']:.2f} s, {baseline['rss']:.0f} MiB.\n"
    )
    header = f"{'trace':<36} {'tool':<16} {'wall s':>7} {'peak MiB':>9} {'GPU idle %':>13}"
    print(header)
    print("-" * len(header))

    summary = []
    unread: list[tuple[str, str]] = []
    labels = {"cli": "gputop analyze", "engine": "gputop engine", "hta": "HTA"}
    for trace in traces:
        runs: dict[str, list[dict]] = {tool: [] for tool in labels}
        for _ in range(args.repeat):
            for tool in runs:
                runs[tool].append(run_tool(tool, trace, env, hta))
        res = {tool: best_of(rows) for tool, rows in runs.items()}
        size = trace.stat().st_size / 2**20
        events = f", {res['cli']['events']:,} events" if res["cli"].get("events") else ""
        print(f"{trace.name[:36]:<36} ({size:.1f} MiB{events})")
        for tool, label in labels.items():
            r = res[tool]
            if r["ok"]:
                print(f"{'':<36} {label:<16} {r['wall']:>7.2f} {r['rss']:>9.0f} {fmt_idle(r):>13}")
            else:
                print(f"{'':<36} {label:<16} failed: {r['error'][:70]}")
        cli, eng, ref = res["cli"], res["engine"], res["hta"]
        if not ref["ok"]:
            unread.append((trace.name, ref["error"]))
        if cli["ok"] and eng["ok"] and ref["ok"]:
            speed, mem = ref["wall"] / cli["wall"], cli["rss"] / ref["rss"]
            e_speed, e_mem = ref["wall"] / eng["wall"], eng["rss"] / ref["rss"]
            gpu = cli.get("gpu") is not False and cli.get("idle") is not None
            gpu = gpu and ref.get("idle") is not None
            diff = abs(cli["idle"] - ref["idle"]) if gpu else float("nan")
            diff_txt = f"{diff:.2f} points" if gpu else "n/a"
            print(
                f"{'':<36} ratios: analyze {speed:.1f}x faster, {mem:.2f}x the memory; "
                f"engine {e_speed:.1f}x faster, {e_mem:.2f}x the memory; idle diff {diff_txt}"
            )
            summary.append((trace.name, speed, mem, e_speed, e_mem, diff))
        else:
            print(f"{'':<36} ratios: n/a (a tool could not analyse this trace)")
        print()

    if summary:
        _summarise(summary, len(traces))
    if unread:
        print(f"  HTA could not read {len(unread)} of {len(traces)} traces (left out of the "
              "ratios):")
        for name, error in unread:
            print(f"    {name}: {error[:100]}")
    return 0


def _summarise(summary: list[tuple], n_traces: int) -> None:
    def geo(values) -> float:
        values = list(values)
        return math.exp(statistics.fmean(math.log(v) for v in values))

    print(f"Summary over the {len(summary)} of {n_traces} traces both tools analysed:")
    for label, si, mi in (("gputop analyze", 1, 2), ("gputop engine", 3, 4)):
        print(
            f"  {label:<15} {geo(s[si] for s in summary):.1f}x faster (geometric mean; "
            f"slowest {min(s[si] for s in summary):.1f}x), memory "
            f"{geo(s[mi] for s in summary):.2f}x HTA's (worst {max(s[mi] for s in summary):.2f}x)"
        )
    diffs = [s[5] for s in summary if not math.isnan(s[5])]
    if diffs:
        print(
            f"  GPU idle: largest difference {max(diffs):.2f} points over {len(diffs)} GPU traces"
        )
    for label, si, mi in (("gputop analyze", 1, 2), ("gputop engine", 3, 4)):
        met = [
            s for s in summary if s[si] >= 5 and s[mi] <= 0.5 and (math.isnan(s[5]) or s[5] <= 2)
        ]
        print(
            f"  goal (>=5x faster, <=0.5x memory, idle within 2 points) met by {label} on "
            f"{len(met)} of {len(summary)}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
