"""A small GPU cluster for `gputop --prometheus`: simulated dcgm-exporter nodes (HTTP servers
in the test process serving dcgm-exporter's text format), their history backfilled with
`promtool tsdb create-blocks-from openmetrics`, and a real Prometheus scraping them (and a
live `gputop exporter`). Shared by the tests and benchmarks/bench_prometheus_fleet.py."""

from __future__ import annotations

import http.server
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
MIB = 1048576

# dcgm-exporter field -> GPU dict key (units as dcgm-exporter gives them).
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "util",
    "DCGM_FI_DEV_FB_USED": "fb_used",
    "DCGM_FI_DEV_FB_FREE": "fb_free",
    "DCGM_FI_DEV_POWER_USAGE": "power",
    "DCGM_FI_DEV_GPU_TEMP": "temp",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "pcie_rx",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "pcie_tx",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle",
}

# The same fields as dcgm-exporter >= 4.10 names them, with their units: name -> (GPU dict key,
# scale from the legacy unit). Written out as that exporter would export them.
CURRENT_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("util", 0.01),
    "DCGM_FI_DEV_FB_USED_BYTES": ("fb_used", MIB),
    "DCGM_FI_DEV_FB_FREE_BYTES": ("fb_free", MIB),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("power", 1.0),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("temp", 1.0),
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ("sm_clock", 1e6),
    "DCGM_FI_PROF_SM_UTIL_RATIO": ("sm_active", 1.0),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": ("tensor", 1.0),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": ("dram", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND": ("pcie_rx", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": ("pcie_tx", 1.0),
    "DCGM_FI_DEV_XID_ERROR": ("xid", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle", 1.0),
}


def gpu(util: float, used_gib: float = 60.0, **labels: str) -> dict:
    """A GPU's dcgm-exporter values (an H100 80GB)."""
    total = 81559
    used = int(used_gib * 1024)
    return {"util": util, "fb_used": used, "fb_free": total - used, "power": 100 + 5 * util,
            "temp": 45 + util / 5, "sm_clock": 1980, "sm_active": util / 100 * 0.8,
            "tensor": util / 100 * 0.4, "dram": util / 100 * 0.3, "pcie_rx": 2e8, "pcie_tx": 1e8,
            "xid": 0, "throttle": 0, "labels": labels}


@dataclass
class DcgmNode:
    name: str
    gpus: list[dict]
    model: str = "NVIDIA H100 80GB HBM3"
    port: int = 0
    extra: dict = field(default_factory=dict)
    naming: str = "legacy"  # or "current" (dcgm-exporter >= 4.10)

    def series(self, naming: str | None = None) -> list[tuple[str, str, float]]:
        """(metric, label text without braces, value) of every sample it exports."""
        fields = ({m: (k, 1.0) for m, k in DCGM_FIELDS.items()}
                  if (naming or self.naming) == "legacy" else CURRENT_FIELDS)
        out = []
        for index, g in enumerate(self.gpus):
            labels = {"gpu": str(index), "UUID": f"GPU-{self.name}-{index:04d}",
                      "device": f"nvidia{index}", "modelName": self.model,
                      "Hostname": self.name, "container": "", "namespace": "", "pod": "",
                      "hpc_job": "", **g["labels"]}
            text = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
            for metric, (key, scale) in fields.items():
                out.append((metric, text, float(g[key]) * scale))
        return out

    def exposition(self) -> bytes:
        lines = []
        last = None
        for metric, labels, value in sorted(self.series(), key=lambda s: s[0]):
            if metric != last:
                lines.append(f"# HELP {metric} dcgm field\n# TYPE {metric} gauge")
                last = metric
            lines.append(f"{metric}{{{labels}}} {value!r}")
        return ("\n".join(lines) + "\n").encode()


def esc(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve(node: DcgmNode) -> http.server.ThreadingHTTPServer:
    """dcgm-exporter's /metrics for ``node`` on a free port (a daemon thread)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = node.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    node.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def backfill(nodes: list[DcgmNode], start: float, end: float, step: float, out: Path,
             data_dir: Path, job: str = "dcgm", switch: dict[str, float] | None = None) -> None:
    """The nodes' series (as they are now) from ``start`` to ``end`` every ``step`` s, written
    as OpenMetrics and made into TSDB blocks in ``data_dir``. ``switch``: node name -> the time
    it moved from legacy names to current ones (an upgrade mid-window)."""
    times = []
    t = start
    while t <= end:
        times.append(t)
        t += step
    by_metric: dict[str, list[str]] = {}
    for node in nodes:
        instance = f'instance="127.0.0.1:{node.port}",job="{job}"'
        at = (switch or {}).get(node.name)
        spans = [(node.series(), times)] if at is None else [
            (node.series("legacy"), [t for t in times if t < at]),
            (node.series("current"), [t for t in times if t >= at])]
        for series, span in spans:
            for metric, labels, value in series:
                rows = by_metric.setdefault(metric, [])
                for t in span:
                    rows.append(f"{metric}{{{labels},{instance}}} {value!r} {t:.3f}")
    with out.open("w") as f:
        for metric, rows in by_metric.items():
            f.write(f"# HELP {metric} dcgm field\n# TYPE {metric} gauge\n")
            f.write("\n".join(rows))
            f.write("\n")
        f.write("# EOF\n")
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(out),
                    str(data_dir)], check=True, capture_output=True, timeout=600)


def prometheus_config(path: Path, jobs: dict[str, list[str]], interval: str = "1s") -> None:
    scrape = "\n".join(
        f"  - job_name: {name}\n    static_configs:\n      - targets: "
        f"[{', '.join(repr(t) for t in targets)}]" for name, targets in jobs.items())
    path.write_text(f"global:\n  scrape_interval: {interval}\n  evaluation_interval: "
                    f"{interval}\nscrape_configs:\n{scrape}\n")


def start_prometheus(config: Path, data_dir: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                             f"--storage.tsdb.path={data_dir}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
                             "--storage.tsdb.retention.time=30d"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
