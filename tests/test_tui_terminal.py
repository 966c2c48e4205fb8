"""The live monitor in a real terminal (tmux): the acceptance commands of the issue, run the
way a person would, plus NO_COLOR, resizes and the terminal going away (an SSH drop)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from tests.conftest import REPO, cli_env, run_cli, wait_for

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

GPUTOP = f"{sys.executable} -m gputop"
# Any SGR sequence that sets or resets a colour: 30-49 (incl. 38;5/38;2 and 39/49), 90-107.
COLOUR_SGR = re.compile(r"\x1b\[[0-9;:]*(?<![0-9])(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])[;:m]")


class Tmux:
    """A private tmux server with one pane running an interactive shell."""

    def __init__(self, width: int, height: int, env: dict[str, str]) -> None:
        self.socket = f"gputop-test-{uuid.uuid4().hex[:10]}"
        self.env = env
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "main", "-x", str(width),
                  "-y", str(height), "bash --norc --noprofile")
        self.shell_pid = int(self.tmux("display-message", "-p", "-t", "main",
                                       "#{pane_pid}").strip())

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], env=self.env,
                              capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", "main", "-l", line)
        self.tmux("send-keys", "-t", "main", "Enter")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "main", *keys)

    def capture(self, escapes: bool = False) -> str:
        return self.tmux("capture-pane", "-p", "-t", "main", *(["-e"] if escapes else []))

    def gputop(self) -> psutil.Process | None:
        """The gputop process running in the pane, if any."""
        try:
            for child in psutil.Process(self.shell_pid).children():
                if "gputop" in " ".join(child.cmdline()):
                    return child
        except psutil.Error:
            pass
        return None

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=10)


@pytest.fixture
def terminal():
    made: list[Tmux] = []

    def make(width: int, height: int, **env: str) -> Tmux:
        t = Tmux(width, height, cli_env(**env))
        made.append(t)
        return t

    yield make
    for t in made:
        t.kill()


def start(term: Tmux, args: str = "--demo tour") -> tuple[psutil.Process, float]:
    # The prompt is set so "the shell is usable" has something exact to wait for.
    term.type(f"cd {REPO} && PS1='$ '")
    started = time.monotonic()
    term.type(f"{GPUTOP} {args}; echo exit=$?")
    return wait_for(term.gputop, timeout=5), started


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def gone(procs: list[psutil.Process]) -> bool:
    def dead(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(dead(p) for p in procs)


def shows_monitor(screen: str) -> bool:
    return (
        "NVIDIA A100-SXM4-80GB" in screen
        and "NVIDIA H100 80GB HBM3" in screen
        and re.search(r"\b\d{1,3}%", screen) is not None
        and "PID" in screen
        and re.search(r"[├└]─ demo-loader", screen) is not None
    )


def quit_and_check_shell(term: Tmux, proc: psutil.Process) -> float:
    """Press q; return how long the process took to end; check the shell answers after."""
    standins = descendants(proc)
    assert standins, "the demo's stand-in processes run under gputop"
    term.keys("q")
    pressed = time.monotonic()
    proc.wait(timeout=5)
    took = time.monotonic() - pressed
    wait_for(lambda: "exit=0" in term.capture(), timeout=5)
    term.type("echo shell-ok-$((6*7))")
    wait_for(lambda: "shell-ok-42" in term.capture(), timeout=5)
    wait_for(lambda: gone(standins), timeout=5)
    return took


def test_tour_at_120x40_then_q(terminal):
    term = terminal(120, 40)
    proc, started = start(term)
    wait_for(lambda: shows_monitor(term.capture()), timeout=10)
    assert time.monotonic() - started < 3.0, term.capture()
    assert quit_and_check_shell(term, proc) < 1.0


def test_80x24_keeps_the_essentials_and_a_resize_uses_the_space(terminal):
    term = terminal(80, 24)
    proc, _ = start(term)
    wait_for(lambda: shows_monitor(term.capture()), timeout=10)
    small = term.capture().splitlines()
    assert len(small) == 24 and max(len(line) for line in small) <= 80
    assert any("q Quit" in line for line in small)  # the footer is not clipped
    assert any(line.startswith(" 7 NVIDIA L40S") for line in small)  # all 8 GPUs, one each
    term.tmux("resize-window", "-t", "main", "-x", "200", "-y", "60")

    def uses_space() -> bool:
        lines = term.capture().splitlines()
        return (len(lines) == 60 and "╭─  0 · NVIDIA A100-SXM4-80GB" in "\n".join(lines)
                and "findings" in "\n".join(lines) and "q Quit" in lines[-1])

    wait_for(uses_space, timeout=10)
    big = term.capture()
    assert sum(1 for line in big.splitlines() if len(line.rstrip()) > 150) > 30
    assert quit_and_check_shell(term, proc) < 1.0


def test_no_color_leaves_no_colour_escapes(terminal):
    term = terminal(120, 40, NO_COLOR="1")
    proc, _ = start(term)
    wait_for(lambda: shows_monitor(term.capture()), timeout=10)
    time.sleep(1.5)  # let a few ticks repaint: each must stay colourless too
    raw = term.capture(escapes=True)
    assert shows_monitor(raw)
    assert not COLOUR_SGR.search(raw), repr(COLOUR_SGR.search(raw).group())
    assert "\x1b[" not in raw  # nor any other attribute
    quit_and_check_shell(term, proc)


def test_colour_is_there_without_no_color(terminal):
    """The check above can fail: without NO_COLOR the same capture carries colours."""
    term = terminal(120, 40)
    proc, _ = start(term)
    wait_for(lambda: shows_monitor(term.capture()), timeout=10)
    assert COLOUR_SGR.search(term.capture(escapes=True))
    quit_and_check_shell(term, proc)


def test_terminal_hangup_ends_gputop_and_its_demo(terminal):
    """An SSH drop: the terminal goes away under the running monitor."""
    term = terminal(120, 40)
    proc, _ = start(term)
    wait_for(lambda: shows_monitor(term.capture()), timeout=10)
    standins = descendants(proc)
    assert standins
    term.kill()  # the pty closes: SIGHUP, then reads and writes fail
    proc.wait(timeout=5)
    wait_for(lambda: gone(standins), timeout=5)


def test_sigterm_restores_the_terminal(terminal):
    term = terminal(100, 30)
    proc, _ = start(term)
    wait_for(lambda: shows_monitor(term.capture()), timeout=10)
    standins = descendants(proc)
    proc.terminate()
    proc.wait(timeout=5)
    wait_for(lambda: "exit=143" in term.capture(), timeout=5)
    term.type("echo shell-ok-$((6*7))")
    wait_for(lambda: "shell-ok-42" in term.capture(), timeout=5)
    wait_for(lambda: gone(standins), timeout=5)


def test_without_a_terminal_it_says_so_in_one_line():
    result = run_cli("--demo", "tour", stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "needs a terminal" in result.stderr
    assert "Traceback" not in result.stderr
