"""A node's stream cannot forge alert lines or break the fleet screen (issue 27, acceptance 1).

`gputop --hosts` runs the user's `ssh` from PATH; here PATH starts with a fake `ssh` that runs
tests/scripts/hostile_stream.py in place of a node's `gputop stream`. Its stream carries JSON's
short escapes (\\r \\n \\b \\f \\t), C1 controls and bidi overrides in every string field of the
hello, the snapshot and the findings, including a whole forged `RAISED critical` line. One node
sends only the short escapes (what the decoder's fast path used to let through), the other all
of them, as JSON escapes and as raw UTF-8 in turn.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import REPO, SLOW, cli_env, end_popen, wait_for

pytestmark = pytest.mark.timeout(6 * SLOW)

HOSTILE = REPO / "tests" / "scripts" / "hostile_stream.py"
NODES = {"node-short": "forged-short", "node-forged": "forged"}
# What must never reach the terminal raw: C0 controls (a newline only as the end of a line),
# DEL, C1 controls, and the bidi marks, embeddings, overrides and isolates.
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def fake_ssh(tmp_path) -> dict[str, str]:
    """The environment for gputop with the fake `ssh` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    # ssh [options] HOST COMMAND: the host picks the hostile stream.
    ssh.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"kind = {NODES!r}[sys.argv[-2]]\n"
        f"os.environ['PYTHONPATH'] = {str(REPO)!r}\n"
        f"os.execv(sys.executable, [sys.executable, {str(HOSTILE)!r}, kind])\n")
    ssh.chmod(0o755)
    return cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def test_watch_prints_no_forged_line_and_no_raw_control(fake_ssh):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputop", "--interval", "1", "watch",
         "--hosts", ",".join(NODES)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=fake_ssh, cwd=REPO)
    out = bytearray()
    reader = threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True)
    reader.start()
    try:
        def both_raised() -> bool:
            text = bytes(out).decode("utf-8", "replace")
            return all(re.search(rf"^\d\d:\d\d:\d\d {host}: RAISED +critical dataloader-stall",
                                 text, re.M) for host in NODES)

        wait_for(both_raised, timeout=SLOW, interval=0.2)
        time.sleep(3)  # a few more samples of each node, the raw-UTF-8 ones included
        proc.send_signal(signal.SIGINT)
        assert proc.wait(SLOW) == 130
        reader.join(SLOW)
        err = proc.stderr.read().decode("utf-8", "replace")
    finally:
        end_popen(proc)
    text = bytes(out).decode("utf-8")
    assert not RAW.search(text), repr(RAW.search(text))
    assert not RAW.search(err) and "Traceback" not in err, err
    lines = text.splitlines()
    # Every line is one of watch's own: a finding raised (and its three detail lines) or a
    # node's state; the forged "12:00:00 node-x: RAISED" is never a line of its own.
    own = re.compile(rf"^(\d\d:\d\d:\d\d ({'|'.join(NODES)}): |         (evidence|fix|next): )")
    assert all(own.match(line) for line in lines), "\n".join(lines)
    assert not any(line.startswith("12:00:00 node-x") for line in lines)
    raised = [line for line in lines if re.match(r"^\d\d:\d\d:\d\d [\w-]+: RAISED ", line)]
    assert len(raised) == 2, raised  # one finding per node, raised once
    for line in raised:
        assert "forged\\x08\\x0c\\x09end" in line and "\\x0d\\x0a12:00:00 node-x" in line, line
    assert any("\\x85\\x9b31m\\u202e\\u2066\\u200fend" in line for line in lines)


def _pump(pipe, into: bytearray) -> None:
    """Bytes as they come: text mode would turn a raw \\r into a newline."""
    for chunk in iter(lambda: pipe.read1(65536), b""):
        into.extend(chunk)


def test_fleet_screen_shows_every_string_escaped(fake_ssh, monkeypatch):
    """The fleet table and a node's own screen (GPU names, commands, users, the finding's text)
    hold no raw control or bidi character, and no row is broken in two."""
    from gputop.fleet.ssh import SshSettings
    from gputop.tui.fleet.fleet_app import FleetApp
    from gputop.tui.screens.node_screen import NodeScreen
    from tests.tui_data import screen_text

    monkeypatch.setenv("PATH", fake_ssh["PATH"])
    monkeypatch.setenv("PYTHONPATH", fake_ssh["PYTHONPATH"])
    width, height = 160, 40
    screens: list[str] = []

    def clean(screen: str) -> bool:
        screens.append(screen)
        lines = screen.split("\n")
        assert not RAW.search(screen), repr(RAW.search(screen))
        assert len(lines) <= height + 1 and all(len(line) <= width for line in lines), screen
        return True

    async def until(pilot, condition, timeout: float = SLOW) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout} s; the screen:\n"
                                     f"{screens[-1] if screens else ''}")
            await pilot.pause(0.1)

    async def scenario() -> None:
        app = FleetApp(list(NODES), SshSettings(passthrough=("--interval", "1")), 1.0)
        async with app.run_test(size=(width, height)) as pilot:
            def row(host: str) -> bool:
                screen = screen_text(app)
                clean(screen)
                # The node's row: host, GPU, finding and title on one line, escapes shown.
                return re.search(rf"{host} .*dataloader-stall.*\\x0d\\x0a12:00:00", screen)

            await until(pilot, lambda: row("node-short") and row("node-forged"))
            for _ in range(10):  # samples of both kinds (JSON escapes, raw UTF-8)
                await pilot.pause(0.3)
                clean(screen_text(app))
            await pilot.press("home", "enter")
            await until(pilot, lambda: isinstance(app.screen, NodeScreen)
                        and app.screen.table.row_count > 0 and clean(screen_text(app)))
            for _ in range(5):
                await pilot.pause(0.3)
                screen = screen_text(app)
                clean(screen)
            assert "\\x0d\\x0a" in screen, screen
            await pilot.press("escape")
            await pilot.press("q")
        app.monitor.stop()

    import asyncio

    asyncio.run(scenario())
