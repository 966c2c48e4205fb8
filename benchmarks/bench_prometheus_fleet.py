"""`gputop --prometheus` at 1,000 nodes x 8 GPUs x 6 hours, and at 100 nodes, against a real
Prometheus (Debian's package) holding the history.

The history is OpenMetrics text made here, one sample per series every STEP_S (60 s: a common
production scrape interval, and what a 2-core machine can generate for 1,000 nodes x 8 GPUs x
6 h), turned into TSDB blocks by `promtool tsdb create-blocks-from openmetrics` (in 2-hour
pieces, so the text never sits whole on disk) and cached under /tmp between runs. Half of the
nodes speak gputop's exporter (``gputop_gpu_*``, ``gputop_job_*``, ``gputop_finding_active``),
half dcgm-exporter (``DCGM_FI_*``); 100 Slurm jobs of 10 nodes; a few with known problems:
in the dcgm half a job with two nodes held at 0 %, a job with a node at 30 % (a
straggler) and a job with an Xid 48; in gputop's half a job whose rank 3 steps 1.6x slower
and a job whose nodes report dataloader-stall (``problems``).

The monitor (the same code the screen and `watch` run) reads it with "now" at the end of the
stored history (the clock moves on from there, so a cached TSDB serves any later run): the
first refresh (the screen's first full frame: rows built for the jobs), then the next
refreshes (a scrape interval later each). Printed: the time to the first full screen, the time
and gputop's CPU per refresh, its RSS, the queries per refresh and the bytes received.

With ``--dcgm-only`` the fleet is what most clusters run: NVIDIA's dcgm-exporter and nothing
else, half of the nodes with dcgm-exporter >= 4.10's names and units (``..._UTIL_RATIO``,
``..._BYTES``, ``..._BYTES_PER_SECOND``), half with the legacy ones, interleaved (a cluster
upgraded node by node), over the last 20 minutes (every 60 s; at 10,000 nodes that is 560,000
series). Printed per size besides: the same queries sent with curl (4 at once, as gputop sends
them: the floor any client has), and gputop's RSS. ``--watch S`` then runs the real
`gputop watch --json --prometheus URL --duration S` against it with the stock options (the
history then ends now: the data is rebuilt) and prints its job count and any refusal.

Usage: python benchmarks/bench_prometheus_fleet.py [--nodes 1000,10000] [--dcgm-only]
       [--refreshes 3] [--watch 60] [--cache /tmp/gputop-bench-prom]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEP_S = 60
HOURS = 6
GPUS = 8
NODES_PER_JOB = 10
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
MODEL = "NVIDIA H100 80GB HBM3"
FB_TOTAL_MIB = 81559


def node_name(i: int) -> str:
    return f"gpu{i:04d}"


def job_of(i: int) -> int:
    return 1000 + i // NODES_PER_JOB


def problems(nodes: int) -> dict[str, int]:
    """The jobs with known problems, the same count at any size (placed by position): in the
    dcgm half an idle job, a straggler node and an Xid; in gputop's half a slow rank and a
    dataloader stall."""
    jobs = nodes // NODES_PER_JOB
    half = jobs // 2
    return {"idle": 1000 + min(2, half - 1), "slow_node": 1000 + min(3, half - 1),
            "xid": 1000 + min(4, half - 1), "slow_rank": 1000 + half + 1,
            "stall": 1000 + half + 2}


def plan(nodes: int) -> list[tuple[str, str, list[float]]]:
    """(metric, labels, values at each step index modulo len) of every series: the fleet."""
    series: list[tuple[str, str, list[float]]] = []
    half = nodes // 2
    bad = problems(nodes)
    for i in range(nodes):
        job = job_of(i)
        base = 40 + (job * 37) % 55  # the job's utilization, 40-94 %
        if job == bad["idle"] and i % NODES_PER_JOB < 2:
            base = 0
        if job == bad["slow_node"] and i % NODES_PER_JOB == 1:
            base = 30
        dcgm = i < half
        instance = f'instance="{node_name(i)}:{9400 if dcgm else 9101}",job="{"dcgm" if dcgm else "gputop"}"'
        for g in range(GPUS):
            util = [max(0.0, min(100.0, base + ((k * 7 + g) % 9) - 4)) if base else 0.0
                    for k in range(12)]
            used = 20000 + base * 400  # MiB: 20-58 GiB of 80
            owner = f'hpc_job="{job}"'
            if dcgm:
                labels = (f'gpu="{g}",UUID="GPU-{i:04d}-{g}",modelName="{MODEL}",'
                          f'Hostname="{node_name(i)}",{owner},{instance}')
                series += [
                    ("DCGM_FI_DEV_GPU_UTIL", labels, util),
                    ("DCGM_FI_DEV_FB_USED", labels, [used]),
                    ("DCGM_FI_DEV_FB_FREE", labels, [FB_TOTAL_MIB - used]),
                    ("DCGM_FI_DEV_POWER_USAGE", labels, [100 + 5 * u for u in util]),
                    ("DCGM_FI_PROF_SM_ACTIVE", labels, [u / 125 for u in util]),
                    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels, [u / 250 for u in util]),
                    ("DCGM_FI_DEV_XID_ERRORS", labels,
                     [48.0 if job == bad["xid"] and g == 3 and i % NODES_PER_JOB == 0 else 0.0]),
                ]
            else:
                labels = f'gpu="{g}",UUID="GPU-{i:04d}-{g}",model_name="{MODEL}",{owner},{instance}'
                step = 0.25 + (job % 5) * 0.05
                if job == bad["slow_rank"] and i % NODES_PER_JOB == 0 and g == 3:
                    step *= 1.6
                job_labels = f'gpu="{g}",rank="{(i % NODES_PER_JOB) * GPUS + g}",{instance}'
                series += [
                    ("gputop_gpu_utilization_percent", labels, util),
                    ("gputop_gpu_memory_used_bytes", labels, [used * 1048576.0]),
                    ("gputop_gpu_memory_total_bytes", labels, [FB_TOTAL_MIB * 1048576.0]),
                    ("gputop_gpu_power_usage_watts", labels, [100 + 5 * u for u in util]),
                    ("gputop_gpu_sm_active_ratio", labels, [u / 125 for u in util]),
                    ("gputop_job_step_time_seconds", f'{job_labels},quantile="0.5"', [step]),
                    ("gputop_job_mfu_ratio", job_labels, [0.2 + base / 300]),
                ]
                if job == bad["stall"]:
                    series.append(("gputop_finding_active",
                                   f'id="dataloader-stall",severity="warning",gpu="{g}",'
                                   f'{instance}', [1.0]))
        if not dcgm:
            series.append(("gputop_info", f'hostname="{node_name(i)}",version="0.1",{instance}',
                           [1.0]))
    return series


# dcgm-exporter's fields as its two namings export them: legacy name, current (>= 4.10) name,
# and the current value's scale from the legacy unit.
DCGM_NAMINGS = (
    ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", 0.01),
    ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES", 1048576.0),
    ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE_BYTES", 1048576.0),
    ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0),
    ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO", 1.0),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", 1.0),
    ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", 1.0),
)
DCGM_ONLY_S = 20 * 60


def plan_dcgm(nodes: int) -> list[tuple[str, str, list[float]]]:
    """A dcgm-only fleet, every other node on dcgm-exporter >= 4.10's names and units."""
    series: list[tuple[str, str, list[float]]] = []
    bad = problems(2 * nodes)  # every job is a dcgm job: the problems of the first half
    for i in range(nodes):
        job = job_of(i)
        base = 40 + (job * 37) % 55
        if job == bad["idle"] and i % NODES_PER_JOB < 2:
            base = 0
        if job == bad["slow_node"] and i % NODES_PER_JOB == 1:
            base = 30
        current = i % 2 == 0
        instance = f'instance="{node_name(i)}:9400",job="dcgm"'
        for g in range(GPUS):
            util = [max(0.0, min(100.0, base + ((k * 7 + g) % 9) - 4)) if base else 0.0
                    for k in range(12)]
            used = 20000 + base * 400
            labels = (f'gpu="{g}",UUID="GPU-{i:04d}-{g}",modelName="{MODEL}",'
                      f'{"hostname" if current else "Hostname"}="{node_name(i)}",'
                      f'hpc_job="{job}",{instance}')
            xid = 48.0 if job == bad["xid"] and g == 3 and i % NODES_PER_JOB == 0 else 0.0
            values = (util, [used], [FB_TOTAL_MIB - used], [100 + 5 * u for u in util],
                      [u / 125 for u in util], [2e8], [xid])
            for (legacy, new, scale), v in zip(DCGM_NAMINGS, values):
                series.append((new if current else legacy, labels,
                               [x * scale for x in v] if current else v))
    return series


def build(nodes: int, cache: Path, dcgm_only: bool = False, fresh: bool = False
          ) -> tuple[Path, float]:
    """The TSDB for ``nodes`` (cached unless ``fresh``), and the end of its history."""
    data = cache / (f"dcgm-{nodes}" if dcgm_only else f"nodes-{nodes}")
    done = data / "END"
    if done.exists() and not fresh:
        return data, float(done.read_text())
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    t0 = time.monotonic()
    series = plan_dcgm(nodes) if dcgm_only else plan(nodes)
    if dcgm_only:  # a short history, ending now (a scrape ago)
        end = float(int(time.time() // STEP_S * STEP_S))
        start = end - DCGM_ONLY_S
    else:
        end = float(int(time.time() // 3600 * 3600))  # a whole hour: blocks align on 2 h
        start = end - HOURS * 3600
    text = cache / f"piece-{nodes}.om"
    lines = 0
    chunk = 100_000  # series per promtool run (overlapping blocks: Prometheus merges them)
    for first in range(0, len(series), chunk):
        by_metric: dict[str, list[tuple[str, list[float]]]] = {}
        for metric, labels, values in series[first:first + chunk]:
            by_metric.setdefault(metric, []).append((labels, values))
        for piece_start in range(int(start), int(end), 7200):
            steps = range(piece_start, min(piece_start + 7200, int(end) + 1), STEP_S)
            with text.open("w") as out:
                for metric, items in by_metric.items():
                    kind = "unknown" if metric == "gputop_info" else "gauge"
                    out.write(f"# TYPE {metric} {kind}\n")
                    for labels, values in items:
                        head = f"{metric}{{{labels}}} "
                        n = len(values)
                        out.write("".join(f"{head}{values[(t // STEP_S) % n]:g} {t}\n"
                                          for t in steps))
                        lines += len(steps)
                out.write("# EOF\n")
            subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(text),
                            str(data)], check=True, capture_output=True)
    text.unlink()
    done.write_text(f"{end}")
    span = f"{DCGM_ONLY_S // 60} min" if dcgm_only else f"{HOURS} h"
    print(f"  built {nodes} nodes: {len(series)} series, {lines} samples (every {STEP_S} s "
          f"for {span}) in {time.monotonic() - t0:.0f} s", flush=True)
    return data, end


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(data: Path) -> tuple[subprocess.Popen, str]:
    config = data.parent / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: {STEP_S}s\nscrape_configs: []\n")
    port = free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                             f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"prometheus did not start: {proc.stderr.read()[-500:]}")


def measure(nodes: int, url: str, end: float, refreshes: int, dcgm_only: bool = False,
            timeout: float | None = None) -> dict:
    from gputop.fleet.prometheus.client import PromClient
    from gputop.fleet.prometheus.monitor import PromFleetMonitor
    from gputop.tui.view.prom_rows import job_rows

    class Recording(PromClient):
        """The client gputop runs, noting each request of a refresh (for curl to replay)."""

        asked: list[str] = []

        def _body(self, path, params, *args, **kwargs):
            self.asked.append(f"{self.base}{path}?{urllib.parse.urlencode(params or {})}")
            return super()._body(path, params, *args, **kwargs)

    offset = {"s": 0.0}
    base = time.time()
    # The stock options (timeout and bounds as the CLI's defaults) unless --prom-timeout.
    client = Recording(url, timeout=timeout) if timeout else Recording(url)
    monitor = PromFleetMonitor(client, interval=1.0,
                               clock=lambda: end + (time.time() - base) + offset["s"])
    me = psutil.Process()
    t0, c0 = time.monotonic(), time.process_time()
    monitor.refresh_once()
    state = monitor.state()
    if not state.ok:  # said in the table, as gputop says it
        return {"error": state.error, "rss": me.memory_info().rss}
    rows = job_rows(state.jobs, 159, False)
    first = {"wall": time.monotonic() - t0, "cpu": time.process_time() - c0,
             "queries": state.queries, "bytes": state.bytes}
    runs = []
    for _ in range(refreshes):
        offset["s"] += STEP_S  # the next scrape interval
        client.asked.clear()
        t0, c0 = time.monotonic(), time.process_time()
        monitor.refresh_once()
        state = monitor.state()
        assert state.ok, state.error
        rows = job_rows(state.jobs, 159, False)
        runs.append({"wall": time.monotonic() - t0, "cpu": time.process_time() - c0,
                     "queries": state.queries, "bytes": state.bytes})
    curl = curl_wall(list(client.asked))
    gpus = sum(len(n.gpus) for n in state.nodes.values())
    findings = sum(len(n.findings) for n in state.nodes.values())
    print(f"  {nodes} nodes: {len(state.nodes)} nodes and {gpus} GPUs read, {len(state.jobs)} "
          f"jobs ({len(rows)} rows), {findings} findings")
    for job in state.jobs[:3]:
        print(f"    top waster {job.key}: {job.wasted_gpu_h:.1f} GPU-h, "
              f"{', '.join(sorted({f.id for f in job.findings})) or 'no finding'}")
    for what, number in problems(nodes).items():
        if dcgm_only and what in ("slow_rank", "stall"):  # gputop's exporter's problems
            continue
        key = f"slurm:{number}"
        job = next((j for j in state.jobs if j.key == key), None)
        if job is not None:
            print(f"    {what} {key}: findings {sorted({f.id for f in job.findings})}; straggler "
                  f"{job.straggler}")
    rss = me.memory_info().rss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"first": first, "runs": runs, "rss": rss, "peak": peak, "curl": curl}


def curl_wall(urls: list[str]) -> float | None:
    """Wall time of sending ``urls`` with curl, 4 at once (as gputop sends them)."""
    curl = shutil.which("curl")
    if curl is None or not urls:
        return None
    from concurrent.futures import ThreadPoolExecutor

    def one(u: str) -> None:
        subprocess.run([curl, "-sf", "-o", "/dev/null", u], check=True, timeout=300)

    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, urls))
    return time.monotonic() - t0


def watch(url: str, seconds: int) -> None:
    """The real CLI with the stock options: how many job lines, and any refusal or down."""
    done = subprocess.run([sys.executable, "-m", "gputop", "watch", "--json", "--prometheus",
                           url, "--duration", str(seconds)], capture_output=True, text=True,
                          timeout=seconds + 300, env={**os.environ, "PYTHONPATH": str(REPO)})
    jobs = down = 0
    reasons = []
    for line in done.stdout.splitlines():
        item = json.loads(line)
        jobs += item.get("kind") == "job"
        if item.get("state") == "down":
            down += 1
            reasons.append(item.get("reason"))
    print(f"  gputop watch --json --prometheus URL --duration {seconds}: exit "
          f"{done.returncode}, {jobs} job lines, {down} down lines"
          + (f" ({reasons[0]})" if reasons else "")
          + (f"; stderr: {done.stderr.strip()[-300:]}" if done.stderr.strip() else ""),
          flush=True)


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", nargs="+", default=["1000", "100"],
                        help="fleet sizes (1000,10000 or 1000 10000)")
    parser.add_argument("--dcgm-only", action="store_true",
                        help="dcgm-exporter only, half >= 4.10 names and half legacy")
    parser.add_argument("--refreshes", type=int, default=3)
    parser.add_argument("--watch", type=int, default=0, metavar="S",
                        help="then run `gputop watch --json --duration S` on it (rebuilt to "
                             "end now)")
    parser.add_argument("--prom-timeout", type=float, default=None, metavar="S",
                        help="gputop's --prom-timeout (default: the CLI's, 10 s)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/gputop-bench-prom"))
    args = parser.parse_args()
    counts = [n for text in args.nodes for n in sizes(text)]
    table = []
    for nodes in counts:
        # Each size in its own process: RSS of one does not hide in the other's.
        if len(counts) > 1:
            command = [sys.executable, __file__, "--nodes", str(nodes), "--refreshes",
                       str(args.refreshes), "--cache", str(args.cache), "--watch",
                       str(args.watch)] + (["--dcgm-only"] if args.dcgm_only else []) + (
                           ["--prom-timeout", str(args.prom_timeout)] if args.prom_timeout
                           else [])
            done = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(REPO)},
                                  stdout=subprocess.PIPE, text=True)
            sys.stdout.write(done.stdout)
            if done.returncode:
                return done.returncode
            table += [line for line in done.stdout.splitlines() if line.startswith("| ")][-1:]
            continue
        data, end = build(nodes, args.cache, args.dcgm_only, fresh=args.watch > 0)
        proc, url = serve(data)
        try:
            r = measure(nodes, url, end, args.refreshes, args.dcgm_only, args.prom_timeout)
            if args.watch:
                watch(url, args.watch)
        finally:
            proc.terminate()
            proc.wait(30)
        if "error" in r:
            print(f"{nodes} nodes: the first refresh failed: {r['error']}", flush=True)
            table.append(f"| {nodes} | {nodes * GPUS} | down: {r['error']} | | | | | "
                         f"{r['rss'] / 2**20:.0f} |")
            print(table[-1], flush=True)
            continue
        runs = r["runs"]
        walls = sorted(x["wall"] for x in runs)
        cpu = sorted(x["cpu"] for x in runs)[len(runs) // 2]
        span = f"{DCGM_ONLY_S // 60} min" if args.dcgm_only else f"{HOURS} h"
        print(f"{nodes} nodes x {GPUS} GPUs, {span} every {STEP_S} s:\n"
              f"  first full screen {r['first']['wall']:.2f} s (CPU {r['first']['cpu']:.2f} s, "
              f"{r['first']['queries']} queries, {r['first']['bytes'] / 1e6:.1f} MB)\n"
              f"  one refresh: {walls[len(walls) // 2]:.2f} s wall (median of {len(runs)}), "
              f"CPU {cpu:.2f} s, "
              f"{runs[-1]['queries']} queries, {runs[-1]['bytes'] / 1e6:.2f} MB received\n"
              f"  RSS {r['rss'] / 2**20:.0f} MB (peak {r['peak'] / 2**20:.0f} MB)", flush=True)
        curl = "-" if r["curl"] is None else f"{r['curl']:.2f}"
        table.append(f"| {nodes} | {nodes * GPUS} | {runs[-1]['queries']} | "
                     f"{runs[-1]['bytes'] / 1e6:.2f} | {cpu:.2f} | {walls[len(walls) // 2]:.2f} |"
                     f" {curl} | {r['rss'] / 2**20:.0f} (peak {r['peak'] / 2**20:.0f}) |")
        print(table[-1], flush=True)
    if len(counts) > 1 or table:
        print("\n| nodes | GPUs | queries | MB per refresh | gputop CPU s | gputop wall s | "
              "curl wall s | RSS MB |\n|---|---|---|---|---|---|---|---|")
        print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
