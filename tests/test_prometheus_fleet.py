"""`gputop --prometheus URL` and `gputop watch --prometheus URL` against a real Prometheus
(Debian's package) that scrapes a live `gputop exporter` (demo) and three simulated
dcgm-exporter nodes, with 12 minutes of their history backfilled by `promtool tsdb
create-blocks-from openmetrics` (issue 39, acceptance 1-4).

The cluster: node-a and node-b run Slurm job 4242 (node-b's GPU 1 lags: 40 % against 95 %);
node-c's two GPUs are held by pod ml/train-idle-worker-0 at 0 % utilization for the whole
12 minutes; the gputop exporter runs the input-starved demo."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.busy_host import shows
from tests.conftest import REPO, SLOW, cli_env, end_popen, wait_for
from tests.promfleet_kit import (
    DcgmNode,
    backfill,
    gpu,
    prometheus_config,
    serve,
    start_prometheus,
)
from tests.test_exporter_prometheus import Prom, answers, prometheus_or_skip, start_exporter
from tests.test_tui_terminal import GPUTOP, terminal  # noqa: F401  (the tmux fixture)

pytestmark = pytest.mark.timeout(6 * SLOW)
HISTORY_S = 12 * 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, share_process):
    prometheus_or_skip()
    tmp = tmp_path_factory.mktemp("promfleet")
    nodes = [
        DcgmNode("node-a", [gpu(95, hpc_job="4242"), gpu(96, hpc_job="4242")]),
        DcgmNode("node-b", [gpu(94, hpc_job="4242"), gpu(40, hpc_job="4242")]),
        DcgmNode("node-c", [gpu(0, 70, pod="train-idle-worker-0", namespace="ml"),
                            gpu(0, 70, pod="train-idle-worker-0", namespace="ml")]),
    ]
    servers = [serve(n) for n in nodes]
    started: list[subprocess.Popen] = []
    try:
        exporter_port, prom_port = free_port(), free_port()
        share_process(start_exporter(started, ["--demo", "input-starved", "--interval", "1"],
                                     exporter_port))
        data = tmp / "data"
        now = time.time()
        backfill(nodes, now - HISTORY_S, now - 5, 1.0, tmp / "history.om", data)
        config = tmp / "prometheus.yml"
        prometheus_config(config, {
            "gputop": [f"127.0.0.1:{exporter_port}"],
            "dcgm": [f"127.0.0.1:{n.port}" for n in nodes]})
        args = (config, data, prom_port)
        prom = share_process(start_prometheus(*args))
        url = f"http://127.0.0.1:{prom_port}"
        wait_for(lambda: answers(f"{url}/-/ready") or prom.poll() is not None, timeout=SLOW)
        assert prom.poll() is None, prom.stderr.read()
        state = {"prom": prom, "args": args, "url": url, "share": share_process}
        yield state
        started.append(state["prom"])
    finally:
        for proc in started:
            end_popen(proc)
        for server in servers:
            server.shutdown()


def watch(url: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gputop", "watch", "--json", "--prometheus",
                             url, *extra], env=cli_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_watch_prints_every_nodes_findings_and_the_two_node_job(cluster):
    """Acceptance 1 and 2: findings with their host, the job spanning node-a and node-b with
    its straggler, and node-c's GPUs idle under their pod for the 12 minutes stored."""
    # The exporter's demo job raises its finding on the node first (its own rules, a loaded
    # machine may take a while): then every node has a finding for watch to print.
    prom = Prom(cluster["url"])
    wait_for(lambda: prom.query('gputop_finding_active{id=~"dataloader-stall|cpu-contention"} '
                                '== 1'),
             timeout=2 * SLOW, interval=0.5)
    proc = watch(cluster["url"], "--duration", "30")
    out, err = proc.communicate(timeout=SLOW)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    lines = [json.loads(line) for line in out.splitlines()]
    findings = [x for x in lines if x.get("state") == "raised"]
    jobs = {x["job"]: x for x in lines if x.get("kind") == "job"}
    assert all(f["host"] for f in findings)
    # The two-node Slurm job, its lagging GPU named with how far.
    job = jobs["slurm:4242"]
    assert sorted(job["nodes"]) == ["node-a", "node-b"] and job["gpus"] == 4
    assert job["straggler"].startswith("node-b GPU 1: 40% busy"), job
    assert "54 points under the median" in job["straggler"]
    # The dcgm-only node held at 0 %: an idle finding that names its pod (the rules make it
    # `hung`, no GPU work for a minute and no step counter, with gpu-idle in its evidence).
    idle = [f for f in findings if f["host"] == "node-c" and f["id"] in ("gpu-idle", "hung")]
    assert {f["gpu"] for f in idle} == {0, 1}, findings
    for f in idle:
        assert "pod ml/train-idle-worker-0" in f["title"] + f["evidence"], f
        assert "gpu-idle" in f["id"] + f["evidence"]
        assert f["job"] == "pod:ml/train-idle"
    pod_job = jobs["pod:ml/train-idle"]
    assert pod_job["wasted_gpu_hours"] > 0.3  # 2 GPUs x 100 % idle x 12+ minutes
    # The gputop exporter's own finding, under its host.
    own = [f for f in findings if f["source"] == "gputop"]
    assert any(shows(f, "dataloader-stall") for f in own), findings
    assert all(f["host"] == socket.gethostname() for f in own)


def test_fleet_screen_in_tmux_jobs_wasters_first_enter_shows_nodes(cluster, terminal):  # noqa: F811
    """Acceptance 3: the jobs, the idle pod's first; Enter: its node; Enter: its GPUs."""
    wait_for(lambda: answers(f"{cluster['url']}/-/ready"), timeout=SLOW)
    term = terminal(160, 40)
    term.type(f"cd {REPO} && PS1='$ '")
    term.type(f"{GPUTOP} --prometheus {cluster['url']}; echo exit=$?")

    def jobs_listed() -> bool:
        screen = term.capture()
        return "pod:ml/train-idle" in screen and "slurm:4242" in screen

    wait_for(jobs_listed, timeout=SLOW, interval=0.5)
    screen = term.capture()
    assert screen.index("pod:ml/train-idle") < screen.index("slurm:4242")  # wasters first
    term.keys("Enter")
    wait_for(lambda: "node-c" in term.capture() and "job pod:ml/train-idle" in term.capture(),
             timeout=SLOW, interval=0.5)
    term.keys("Enter")
    wait_for(lambda: "node-c GPU 1" in term.capture() and "▁" in term.capture(),
             timeout=SLOW, interval=0.5)
    term.keys("q")
    term.keys("q")
    term.keys("q")
    wait_for(lambda: "exit=0" in term.capture(), timeout=SLOW, interval=0.5)


def test_prometheus_stopped_mid_run_one_line_then_recovery(cluster, terminal):  # noqa: F811
    """Acceptance 4: the server stops: one line, no traceback (watch), the screen keeps the
    last data dimmed with its age and why; back: one line, fresh data again."""
    term = terminal(160, 30)
    term.type(f"cd {REPO} && PS1='$ '")
    term.type(f"{GPUTOP} --prometheus {cluster['url']}; echo exit=$?")
    wait_for(lambda: "slurm:4242" in term.capture(), timeout=SLOW, interval=0.5)
    proc = watch(cluster["url"], "--duration", "90")
    seen: list[dict] = []

    def line_with(pred) -> dict | None:
        while True:
            text = proc.stdout.readline()
            if not text:
                return None
            seen.append(json.loads(text))
            if pred(seen[-1]):
                return seen[-1]

    try:
        assert line_with(lambda x: x.get("kind") == "job") is not None
        end_popen(cluster["prom"])
        down = line_with(lambda x: x.get("kind") == "prometheus")
        assert down is not None and down["state"] == "down", seen
        assert "Connection refused" in down["reason"] or "timed out" in down["reason"]
        wait_for(lambda: "last data" in term.capture() and "slurm:4242" in term.capture(),
                 timeout=SLOW, interval=0.5)
        assert "Traceback" not in term.capture()
        cluster["prom"] = cluster["share"](start_prometheus(*cluster["args"]))
        up = line_with(lambda x: x.get("kind") == "prometheus")
        assert up is not None and up["state"] == "up", seen
        wait_for(lambda: "last data" not in term.capture(), timeout=2 * SLOW, interval=0.5)
        term.keys("q")
        wait_for(lambda: "exit=0" in term.capture(), timeout=SLOW, interval=0.5)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=SLOW)
    assert "Traceback" not in err
    assert sum(1 for x in seen if x.get("kind") == "prometheus") == 2  # one line each way


def test_job_rules_pass_promtool():
    """deploy/: the job recording rules and their alert, checked and unit-tested."""
    prometheus_or_skip()
    rules = REPO / "deploy" / "prometheus"
    check = subprocess.run(["promtool", "check", "rules", "gputop-jobs.yml"], cwd=rules,
                           capture_output=True, text=True, timeout=SLOW)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(["promtool", "test", "rules", "gputop-jobs.test.yml"], cwd=rules,
                          capture_output=True, text=True, timeout=SLOW)
    assert unit.returncode == 0, unit.stdout + unit.stderr
