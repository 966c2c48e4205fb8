"""dcgm-exporter's two namings in one fleet, against a real Prometheus (Debian's package) with
the nodes' history backfilled by promtool: a node on dcgm-exporter >= 4.10 names and units
whose GPUs a pod holds idle, a busy node on the legacy names, and a busy node that upgraded
six minutes ago (its series change names mid-window). Which naming a node has is seen from its
series; every unit reads in the model's."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, SLOW, cli_env, end_popen, wait_for
from tests.promfleet_kit import DcgmNode, backfill, gpu, prometheus_config, serve, start_prometheus
from tests.test_exporter_prometheus import answers, prometheus_or_skip
from tests.test_prometheus_fleet import free_port

pytestmark = pytest.mark.timeout(6 * SLOW)
HISTORY_S = 12 * 60


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, share_process):
    prometheus_or_skip()
    tmp = tmp_path_factory.mktemp("namings")
    nodes = [
        DcgmNode("node-new", [gpu(0, 70, pod="train-idle-worker-0", namespace="ml"),
                              gpu(0, 70, pod="train-idle-worker-0", namespace="ml")],
                 naming="current"),
        DcgmNode("node-old", [gpu(92, hpc_job="77"), gpu(93, hpc_job="77")]),
        DcgmNode("node-mid", [gpu(88, hpc_job="78"), gpu(89, hpc_job="78")], naming="current"),
    ]
    servers = [serve(n) for n in nodes]
    prom = None
    try:
        now = time.time()
        data = tmp / "data"
        backfill(nodes, now - HISTORY_S, now - 5, 1.0, tmp / "history.om", data,
                 switch={"node-mid": now - 6 * 60})
        config = tmp / "prometheus.yml"
        prometheus_config(config, {"dcgm": [f"127.0.0.1:{n.port}" for n in nodes]})
        port = free_port()
        prom = share_process(start_prometheus(config, data, port))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(f"{url}/-/ready") or prom.poll() is not None, timeout=SLOW)
        assert prom.poll() is None, prom.stderr.read()
        yield {"url": url, "nodes": {n.name: n for n in nodes}}
    finally:
        if prom is not None:
            end_popen(prom)
        for server in servers:
            server.shutdown()


def test_both_namings_read_side_by_side_units_converted(fleet):
    proc = subprocess.Popen([sys.executable, "-m", "gputop", "watch", "--json",
                             "--prometheus", fleet["url"], "--duration", "30"], env=cli_env(),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=3 * SLOW)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    lines = [json.loads(line) for line in out.splitlines()]
    assert not any(x.get("state") == "down" for x in lines), lines
    findings = [x for x in lines if x.get("state") == "raised"]
    jobs = {x["job"]: x for x in lines if x.get("kind") == "job"}
    # The node on current names: its pod's GPUs idle, named (memory read from bytes).
    idle = [f for f in findings if f["host"] == "node-new" and f["id"] in ("gpu-idle", "hung")]
    assert {f["gpu"] for f in idle} == {0, 1}, findings
    for f in idle:
        assert "pod ml/train-idle-worker-0" in f["title"] + f["evidence"], f
    assert jobs["pod:ml/train-idle"]["wasted_gpu_hours"] > 0.3
    # The busy legacy node: nothing idle; its utilization a percentage in range.
    assert not [f for f in findings if f["host"] == "node-old"
                and f["id"] in ("gpu-idle", "hung")], findings
    old = jobs["slurm:77"]
    assert old["nodes"] == ["node-old"] and 90 <= old["util_mean"] <= 95, old
    # The node that upgraded mid-window: still one node, busy, in %, from its ratio series.
    mid = jobs["slurm:78"]
    assert mid["nodes"] == ["node-mid"] and 85 <= mid["util_mean"] <= 92, mid
    assert not [f for f in findings if f["host"] == "node-mid"
                and f["id"] in ("gpu-idle", "hung")], findings
    assert mid["wasted_gpu_hours"] < 0.05  # the hour's utilization read across both namings


def test_each_nodes_naming_is_seen_and_units_land_in_the_model(fleet):
    from gputop.fleet.prometheus.client import PromClient
    from gputop.fleet.prometheus.monitor import PromFleetMonitor

    monitor = PromFleetMonitor(PromClient(fleet["url"]), interval=1.0)
    monitor.refresh_once()
    state = monitor.state()
    assert state.ok, state.error
    by_host = {n.host: n for n in state.nodes.values()}
    assert "dcgm-exporter >= 4.10" in by_host["node-new"].notes[0]
    assert "<= 4.8" in by_host["node-old"].notes[0]
    assert "dcgm-exporter >= 4.10" in by_host["node-mid"].notes[0]
    for host in ("node-new", "node-old", "node-mid"):
        for g in by_host[host].gpus:
            assert g.mem_total == pytest.approx(81559 * 1048576), (host, g)  # MiB, bytes -> B
            assert g.power_w is not None and 100 <= g.power_w <= 600
    new = by_host["node-new"].gpus[0]
    assert new.mem_used == pytest.approx(70 * 1024 * 1048576) and new.util == 0
    assert by_host["node-old"].gpus[0].sm_active == pytest.approx(92 * 0.8)  # ratio -> %
