"""`gputop --demo fleet` (issue 38, acceptance 5): the fleet screen with several simulated nodes,
each a local `gputop --demo SCENARIO stream`, without ssh or sshd."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

from gputop.fleet import demo
from tests.conftest import REPO, SLOW, cli_env, end_popen, wait_for


async def _until(pilot, condition, timeout: float = SLOW) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition}")
        await pilot.pause(0.05)


def test_the_fleet_screen_shows_every_simulated_node():
    from gputop.cli import build_parser
    from gputop.fleet.demo import fleet_from_args
    from gputop.tui.fleet.fleet_app import FleetApp
    from tests.tui_data import screen_text

    hosts, settings = fleet_from_args(build_parser().parse_args(["--demo", "fleet"]))
    assert hosts == list(demo.NODES) and len(hosts) >= 3
    assert settings.ssh_argv("node01", "x")[0] == "sh"  # local: no ssh

    async def scenario() -> None:
        app = FleetApp(hosts, settings, 1.0)
        async with app.run_test(size=(120, 40)) as pilot:
            def up(host: str) -> bool:
                return app.monitor.view(host).seq > 0

            await _until(pilot, lambda: all(up(h) for h in hosts))
            await _until(pilot, lambda: all(h in screen_text(app) for h in hosts))
            text = screen_text(app)
            assert "DOWN" not in text and "ssh" not in text.lower(), text
            await pilot.press("q")
        app.monitor.stop()

    asyncio.run(scenario())


def test_watch_on_the_demo_fleet_names_findings_by_node():
    proc = subprocess.Popen([sys.executable, "-m", "gputop", "--demo", "fleet", "watch",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env(), cwd=REPO)
    hosts: set[str] = set()
    try:
        def two_nodes() -> bool:
            line = proc.stdout.readline()
            if line.strip():
                hosts.add(json.loads(line)["host"])
            return len(hosts) >= 2

        wait_for(two_nodes, timeout=SLOW, interval=0)
        assert hosts <= set(demo.NODES)
    finally:
        end_popen(proc)


def test_demo_fleet_goes_only_with_the_monitor_and_watch():
    from tests.conftest import run_cli

    done = run_cli("--demo", "fleet", "snapshot")
    assert done.returncode == 2 and "--demo fleet" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_nodes_run_from_the_folder_that_holds_a_checkout(tmp_path):
    """Where `git clone` leaves you: a folder whose gputop/ is the checkout (no __init__.py),
    which `python -m gputop` run there would import instead of the installed package."""
    (tmp_path / "gputop" / "gputop").mkdir(parents=True)
    (tmp_path / "gputop" / "README.md").write_text("a checkout\n")
    _, settings = demo.targets_and_settings(type("Args", (), {})())
    argv = settings.ssh_argv("node01", settings.gputop_command("snapshot", "--json"))
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=cli_env(),
                          timeout=SLOW)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpus"], done.stdout
