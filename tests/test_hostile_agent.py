"""Root runs `gputop capture` on another user's job: everything that job's "agent" says is
untrusted. A real process of another uid answers with paths meant to hang or flood the reader."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")

NOBODY = 65534


@pytest.fixture(autouse=True)
def unscoped(monkeypatch):
    """These tests are about another user's agents, which root finds in that user's directory:
    the default discovery, not the tests' own scope ($GPUTOP_SOCKET_DIR, conftest). Foreign
    agents on the host cannot change their results (they only add agents)."""
    monkeypatch.delenv("GPUTOP_SOCKET_DIR")
HOSTILE = str(REPO / "tests" / "scripts" / "hostile_agent.py")
# Runs the CLI in this interpreter and prints its peak RSS (KiB) on stderr's last line.
# The peak is VmHWM, the high-water mark of this program's own memory: ru_maxrss would also
# count the pytest process it was forked from (Linux keeps the larger across exec), hundreds of
# MB once earlier tests have imported torch.
PEAK = ("import sys; from gputop.cli import main; code = main(sys.argv[1:]); "
        "print(next(line.split()[1] for line in open('/proc/self/status') "
        "if line.startswith('VmHWM:')), file=sys.stderr); sys.exit(code)")


@pytest.fixture
def hostile():
    """Start a hostile agent of uid 65534; it and what it made are removed at teardown."""
    started: list[tuple[subprocess.Popen, str]] = []

    def start(kind: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, HOSTILE, "--uid", str(NOBODY), "--kind", kind],
                                stdout=subprocess.PIPE, text=True, env=cli_env(), cwd="/")
        line = proc.stdout.readline().split()
        started.append((proc, line[1] if len(line) > 1 else ""))
        assert line and line[0] == "ready"
        return proc

    yield start
    for proc, home in started:
        proc.kill()
        proc.wait(60)
        if home.startswith("/tmp/hostile-"):
            shutil.rmtree(home, ignore_errors=True)
        try:
            os.unlink(f"/tmp/gputop-{NOBODY}/{proc.pid}.sock")
        except OSError:
            pass


def capture_as_root(pid: int) -> tuple[subprocess.CompletedProcess, int]:
    done = subprocess.run([sys.executable, "-c", PEAK, "capture", str(pid), "--timeout", "5"],
                          capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=120)
    *lines, peak = done.stderr.strip().splitlines()
    done.stderr = "\n".join(line for line in lines if not line.startswith("gputop: capturing"))
    return done, int(peak)


@pytest.mark.parametrize("kind,why", [
    ("fifo", "not a regular file"),
    ("devzero", "not a regular file"),
    ("symlink", "not a regular file"),
    ("sparse", "larger than"),
    ("rootfile", "owned by uid 0"),
])
def test_a_hostile_trace_path_is_refused_unread(hostile, kind, why):
    agent = hostile(kind)
    done, peak_kib = capture_as_root(agent.pid)
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stderr
    error = [ln for ln in done.stdout.splitlines() if "gputop: error" in ln]
    assert len(error) == 1 and why in error[0], done.stdout
    assert "root:" not in done.stdout + done.stderr  # nothing of /etc/shadow
    assert peak_kib < 300 * 1024


def test_an_agent_error_message_cannot_write_to_roots_terminal(hostile):
    agent = hostile("escapes")
    done, _ = capture_as_root(agent.pid)
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "pwned\\x1b]0;owned\\x07" in out  # shown escaped, one line
    assert len(done.stderr.strip().splitlines()) == 1
