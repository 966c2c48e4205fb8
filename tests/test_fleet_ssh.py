"""`gputop --hosts ...` over real OpenSSH (acceptance 2 of issue 16).

Real sshd servers on 127.0.0.x (Debian's openssh-server, throwaway keys, private configs, made
by tests/sshd_kit.py) serve the whole module; each node's gputop is this checkout's on its own
demo scenario, or a hostile stand-in (tests/scripts/hostile_stream.py), or none at all. The
client is the user's ssh with an ssh config given by --ssh-config: ~/.ssh is never read.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from gputop.fleet.monitor import BAD, DOWN, NO_GPUTOP, SLOW, UP, FleetMonitor
from gputop.fleet.ssh import SshSettings
from tests.conftest import REPO, cli_env, end_popen, wait_for
from tests.conftest import SLOW as SLOW_S
from tests.sshd_kit import Cluster, free_port, sshd_missing
from tests.test_tui_terminal import GPUTOP, terminal  # noqa: F401  (the tmux fixture)

pytestmark = pytest.mark.timeout(8 * SLOW_S)

NODES = {
    "node-starved": "input-starved",
    "node-healthy": "healthy",
    "node-hot": "throttled",
    "node-void": "missing",
    "node-evil": "hostile-escapes",
    "node-long": "hostile-long-line",
    "node-flood": "hostile-flood",
    "node-junk": "hostile-garbage",
    "node-mute": "hostile-silent",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, share_process):
    why = sshd_missing()
    if why:
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"{why}: CI must run the fleet tests", pytrace=False)
        pytest.skip(why)
    made = Cluster(tmp_path_factory.mktemp("nodes") / "c", NODES, share=share_process)
    # A node whose sshd is not there at all: connection refused.
    with open(made.ssh_config, "a") as config:
        config.write(f"\nHost node-gone\n  HostName 127.0.0.1\n  Port {free_port()}\n")
    try:
        yield made.start()
    finally:
        made.stop()


def settings(cluster: Cluster, **kw) -> SshSettings:
    return SshSettings(config=str(cluster.ssh_config), remote_gputop=str(cluster.wrapper),
                       passthrough=("--interval", "1"), **kw)


def rows_of(screen: str, host: str) -> list[str]:
    """The lines of one node in the fleet table (its name, then its further GPUs)."""
    lines = screen.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith(host + " "):
            out.append(line)
            for follow in lines[i + 1:]:
                if not follow.startswith(" " * 12) or not re.match(r"^\s+\d+ ", follow):
                    break
                out.append(follow)
    return out


def sample_time(screen: str, host: str) -> str | None:
    rows = rows_of(screen, host)
    found = re.search(r"\b(\d\d:\d\d:\d\d)\b", rows[0]) if rows else None
    return found.group(1) if found else None


def wait_screen(term, condition, timeout: float, interval: float = 0.3) -> None:
    """wait_for on what the terminal shows; a failure prints the last screen."""
    try:
        wait_for(condition, timeout=timeout, interval=interval)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{term.capture()}") from None


def test_fleet_view_of_three_nodes_in_tmux(cluster, terminal):  # noqa: F811
    """Every node's GPUs and the starved node's finding show; a node whose sshd stops is down
    within 10 s while the others keep updating; its sshd back, it is back; Enter opens a
    node's screen; p on the starved job shows the diagnosis its node made."""
    term = terminal(150, 45)
    term.type(f"cd {REPO} && PS1='$ '")
    hosts = "node-starved,node-healthy,node-hot"
    term.type(f"{GPUTOP} --interval 1 --hosts {hosts} --ssh-config {cluster.ssh_config} "
              f"--remote-gputop {cluster.wrapper}; echo exit=$?")

    def _starved_named(screen: str, row: str) -> bool:
        # The starved node's stall, or, on a busy host, the CPU wait that explains it (the three
        # nodes' stand-ins share this machine's cores with whatever else runs).
        if "cpu-contention" in row:
            return True
        return "dataloader-stall" in row and re.search(
            r"node-starved +GPU 0 +dataloader-stall +GPU 0 starved by the input pipeline",
            screen) is not None

    def all_nodes() -> bool:
        screen = term.capture()
        return (len(rows_of(screen, "node-starved")) == 1
                and len(rows_of(screen, "node-healthy")) == 4
                and len(rows_of(screen, "node-hot")) == 2
                and "A100-SXM4-80GB" in screen and "H100 80GB HBM3" in screen
                and _starved_named(screen, rows_of(screen, "node-starved")[0]))

    wait_screen(term, all_nodes, timeout=2 * SLOW_S, interval=0.5)
    assert "3 nodes: 3 up" in term.capture()

    # One node goes away: sshd and its sessions.
    cluster.nodes["node-healthy"].stop()
    stopped = time.monotonic()
    wait_screen(term, lambda: any("DOWN" in r for r in rows_of(term.capture(), "node-healthy")),
                timeout=10.0, interval=0.2)
    print(f"\nnode-healthy shown down {time.monotonic() - stopped:.1f} s after its sshd stopped")
    seen = {"node-starved": set(), "node-hot": set()}

    def others_update() -> bool:
        screen = term.capture()
        for host, times in seen.items():
            times.add(sample_time(screen, host))
        return all(len(t - {None}) >= 3 for t in seen.values())

    wait_screen(term, others_update, timeout=SLOW_S, interval=0.3)
    screen = term.capture()
    # Down it stays, retries included (they keep the reason on show).
    assert [r.split()[1] for r in rows_of(screen, "node-healthy")] == ["DOWN:"], screen
    assert _starved_named(screen, rows_of(screen, "node-starved")[0]), screen

    # It comes back: retried with backoff, its four GPUs again.
    cluster.nodes["node-healthy"].start()
    wait_screen(term, lambda: len(rows_of(term.capture(), "node-healthy")) == 4,
                timeout=2 * SLOW_S, interval=0.5)

    # Enter on the first row (node-starved's GPU 0): that node's own screen.
    term.keys("Home")
    term.keys("Enter")
    wait_screen(term, lambda: "(simulated: input-starved)" in term.capture()
                and "PID" in term.capture(), timeout=SLOW_S)
    term.keys("Escape")
    wait_screen(term, lambda: "gputop fleet" in term.capture(), timeout=SLOW_S)

    # p on that row: the node's gputop captures its job and the diagnosis shows here.
    pytest.importorskip("torch")  # without torch the demo's job has no agent
    term.keys("p")
    wait_screen(term, lambda: "diagnosis of pid" in term.capture(), timeout=3 * SLOW_S,
                interval=0.5)
    screen = term.capture()
    assert "on node-starved: dataloader-stall" in screen, screen
    assert "scp node-starved:" in screen
    term.keys("Escape")  # (q right after Escape would read as Alt-q)
    wait_screen(term, lambda: "gputop fleet" in term.capture(), timeout=SLOW_S)
    term.keys("q")
    wait_screen(term, lambda: "exit=0" in term.capture(), timeout=SLOW_S)


class Lines:
    """A process whose stdout lines are collected as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def json(self) -> list[dict]:
        return [json.loads(line) for line in list(self.lines)]


def test_watch_json_names_each_finding_and_node_by_host(cluster):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputop", "--interval", "1", "watch", "--json",
         "--hosts", "node-hot,node-void,node-gone", "--ssh-config", str(cluster.ssh_config),
         "--remote-gputop", str(cluster.wrapper)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO)
    out = Lines(proc)
    try:
        def everything() -> bool:
            events = out.json()
            return (any(e.get("id") == "throttling" and e["host"] == "node-hot"
                        and e["state"] == "raised" for e in events)
                    and any(e["host"] == "node-void" and e["state"] == NO_GPUTOP
                            for e in events)
                    and any(e["host"] == "node-gone" and e["state"] == DOWN for e in events))

        wait_for(everything, timeout=2 * SLOW_S, interval=0.5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(SLOW_S) == 130
        out.reader.join(SLOW_S)
        events = out.json()
        raised = next(e for e in events if e.get("id") == "throttling")
        assert set(raised) >= {"time", "host", "gpu", "pid", "id", "severity", "title",
                               "evidence", "fix", "next_step", "state"}
        gone = next(e for e in events if e["host"] == "node-gone")
        assert "Connection refused" in gone["reason"]
        void = next(e for e in events if e["host"] == "node-void")
        assert "not found" in void["reason"]
        # Retries of a node that stays down are not repeated as new lines.
        assert sum(1 for e in events if e["host"] == "node-gone") == 1
        assert "Traceback" not in proc.stderr.read()
    finally:
        end_popen(proc)


def test_hostile_and_broken_nodes_are_contained(cluster):
    """Each bad node gets its own state and reason; escapes arrive escaped; a good node beside
    them streams on; a hung node turns slow, then down."""
    hosts = ["node-hot", "node-evil", "node-long", "node-flood", "node-junk", "node-mute",
             "node-void"]
    monitor = FleetMonitor(hosts, settings(cluster), interval=1.0, stale_after=3.0,
                           dead_after=8.0)
    monitor.start()
    try:
        def state(host: str):
            return monitor.view(host).state

        wait_for(lambda: state("node-long") == BAD and state("node-flood") == BAD
                 and state("node-junk") == BAD and state("node-void") == NO_GPUTOP
                 and state("node-evil") == UP and monitor.view("node-hot").seq >= 3,
                 timeout=2 * SLOW_S, interval=0.2)
        assert "longer than" in monitor.view("node-long").reason
        assert "100 GPUs" in monitor.view("node-flood").reason
        assert "not JSON" in monitor.view("node-junk").reason
        evil = monitor.view("node-evil")
        texts = [evil.remote_hostname, evil.snapshot.gpus[0].name,
                 evil.snapshot.gpus[0].processes[0].cmdline,
                 evil.snapshot.gpus[0].processes[0].user, evil.findings[0].title,
                 evil.findings[0].evidence, evil.snapshot.driver.driver_version]
        for text in texts:
            assert not re.search(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text), text
            assert "\\x1b" in text
        wait_for(lambda: state("node-mute") == SLOW, timeout=SLOW_S, interval=0.2)
        wait_for(lambda: state("node-mute") == DOWN, timeout=SLOW_S, interval=0.2)
        assert "no data" in monitor.view("node-mute").reason
        assert monitor.view("node-mute").retry_at is not None
        seq = monitor.view("node-hot").seq
        wait_for(lambda: monitor.view("node-hot").seq > seq + 2, timeout=SLOW_S)
        assert state("node-hot") == UP
    finally:
        monitor.stop()


async def _until(pilot, condition, timeout: float = SLOW_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition}")
        await pilot.pause(0.05)


def test_fleet_app_under_pilot(cluster):
    """The Textual app itself: rows of a good, a refused and a hostile node, escaped text on
    screen, Enter on a node and back, r to retry a node now."""
    from gputop.tui.fleet.fleet_app import FleetApp
    from gputop.tui.screens.node_screen import NodeScreen
    from tests.tui_data import screen_text

    async def scenario() -> None:
        app = FleetApp(["node-hot", "node-gone", "node-evil"], settings(cluster), 1.0)
        async with app.run_test(size=(120, 40)) as pilot:
            def rows(host: str) -> list[str]:
                return [r.text.plain for r in app.table.rows if r.host == host]

            await _until(pilot, lambda: len(rows("node-hot")) == 2
                         and "DOWN" in " ".join(rows("node-gone"))
                         and "dataloader-stall" in " ".join(rows("node-evil")))
            await _until(pilot, lambda: re.search(r"critical node-evil\s+GPU 0\s+dataloader-stall"
                                                  r"\s+starved\\x1b\[2J", screen_text(app)))
            screen = screen_text(app)
            assert "Connection refused" in screen and "· retry" in screen
            assert "\\x1b[2J" in screen and "\x1b" not in screen and "\u202e" not in screen
            await pilot.press("home", "enter")
            await _until(pilot, lambda: isinstance(app.screen, NodeScreen)
                         and len(app.screen.gpu_panel.gpus) == 2 and app.screen.table.row_count > 0)
            assert "node-hot" in screen_text(app) and "simulated: throttled" in screen_text(app)
            name = app.screen.gpu_panel.gpus[1].name[:22]
            await _until(pilot, lambda: f" 1 {name}" in screen_text(app))  # a line per GPU
            await pilot.press("escape")
            await _until(pilot, lambda: not isinstance(app.screen, NodeScreen))
            await pilot.press("down", "down")
            assert app.table.selected().host == "node-gone"
            await pilot.press("r")
            await _until(pilot, lambda: app.monitor.view("node-gone").connects >= 2)
            await pilot.press("q")
        app.monitor.stop()

    import asyncio

    asyncio.run(scenario())
