"""The live monitor in a real terminal (tmux): the acceptance commands of the issue, run the
way a person would, plus NO_COLOR, resizes and the terminal going away (an SSH drop).

Each wait is for what the person would see, with a generous timeout: how fast the monitor
starts and quits is measured by benchmarks/bench_startup.py, not asserted here. Without tmux
these tests are skipped, except in CI (CI=true), where they fail: CI must run them."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from gputop.tui.monitor.plain_frame import MARK as PLAIN_FRAME_MARK
from tests.conftest import REPO, SLOW, cli_env, end_processes, run_cli, wait_for

# Generous per test: a few waits of up to SLOW each on a loaded machine.
pytestmark = pytest.mark.timeout(4 * SLOW)

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
                              capture_output=True, text=True, timeout=SLOW)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", "main", "-l", line)
        self.tmux("send-keys", "-t", "main", "Enter")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "main", *keys)

    def capture(self, escapes: bool = False) -> str:
        """The pane's text; empty while gputop's plain first frame is on it (plain_frame.py:
        the GPUs and processes it shows are not the interface yet, whose keys a test is
        about to press; tests/test_plain_first_frame.py checks that frame itself)."""
        screen = self.tmux("capture-pane", "-p", "-t", "main", *(["-e"] if escapes else []))
        return "" if PLAIN_FRAME_MARK in screen else screen

    def gputop(self) -> psutil.Process | None:
        """The gputop process running in the pane, if any."""
        try:
            for child in psutil.Process(self.shell_pid).children():
                if "gputop" in " ".join(child.cmdline()):
                    return child
        except psutil.Error:
            pass
        return None

    def processes(self) -> list[psutil.Process]:
        """The tmux server of this socket (it daemonizes: not a child of the test) and every
        process under it."""
        try:
            server = psutil.Process(self.shell_pid).parent()
            return [server, *server.children(recursive=True)] if server else []
        except psutil.Error:
            return []

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=SLOW)


def tmux_or_skip() -> None:
    """Skip without tmux; in CI (CI=true) fail instead: there the terminal tests must run."""
    if shutil.which("tmux") is not None:
        return
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail("tmux is not installed: the terminal tests need it (CI=true: not skipped)",
                    pytrace=False)
    pytest.skip("needs tmux")


@pytest.fixture
def terminal():
    """``term = terminal(width, height, **env)``: a private tmux server; when the test ends,
    pass or fail, the server and everything still running in it are ended."""
    tmux_or_skip()
    made: list[Tmux] = []

    def make(width: int, height: int, **env: str) -> Tmux:
        t = Tmux(width, height, cli_env(**env))
        made.append(t)
        return t

    yield make
    for t in made:
        running = t.processes()
        t.kill()  # the pane's shell and gputop get SIGHUP,
        end_processes(running)  # and whatever is left is killed


def start(term: Tmux, args: str = "--demo tour") -> psutil.Process:
    # The prompt is set so "the shell is usable" has something exact to wait for.
    term.type(f"cd {REPO} && PS1='$ '")
    term.type(f"{GPUTOP} {args}; echo exit=$?")
    return wait_for(term.gputop, timeout=SLOW)


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


def wait_for_monitor(term: Tmux) -> None:
    wait_for(lambda: shows_monitor(term.capture()), timeout=SLOW)


def quit_and_check_shell(term: Tmux, proc: psutil.Process) -> None:
    """Press q: gputop ends with 0, its stand-ins with it, and the shell answers after."""
    standins = descendants(proc)
    assert standins, "the demo's stand-in processes run under gputop"
    term.keys("q")
    proc.wait(timeout=SLOW)
    wait_for(lambda: "exit=0" in term.capture(), timeout=SLOW)
    term.type("echo shell-ok-$((6*7))")
    wait_for(lambda: "shell-ok-42" in term.capture(), timeout=SLOW)
    wait_for(lambda: gone(standins), timeout=SLOW)


def test_tour_at_120x40_then_q(terminal):
    term = terminal(120, 40)
    proc = start(term)
    wait_for_monitor(term)
    quit_and_check_shell(term, proc)


def test_80x24_keeps_the_essentials_and_a_resize_uses_the_space(terminal):
    term = terminal(80, 24)
    proc = start(term)
    wait_for_monitor(term)
    # The footer fills in as the app settles, maybe just after the first frame.
    wait_for(lambda: "q Quit" in term.capture().splitlines()[-1], timeout=SLOW)
    small = term.capture().splitlines()
    assert len(small) == 24 and max(len(line) for line in small) <= 80
    assert any("q Quit" in line for line in small)  # the footer is not clipped
    assert any(line.startswith(" 9 NVIDIA H100") for line in small)  # all 10 GPUs, one each
    term.tmux("resize-window", "-t", "main", "-x", "200", "-y", "60")

    def uses_space() -> bool:
        lines = term.capture().splitlines()
        return (len(lines) == 60 and "╭─  0 · NVIDIA A100-SXM4-80GB" in "\n".join(lines)
                and "findings" in "\n".join(lines) and "q Quit" in lines[-1])

    wait_for(uses_space, timeout=SLOW)
    big = term.capture()
    assert sum(1 for line in big.splitlines() if len(line.rstrip()) > 150) > 30
    quit_and_check_shell(term, proc)


def header_time(screen: str) -> str | None:
    """The time of the sample shown in the header (it changes with every tick)."""
    lines = screen.splitlines()
    found = re.search(r"\b\d\d:\d\d:\d\d\s*$", lines[0]) if lines else None
    return found.group().strip() if found else None


def test_no_color_leaves_no_colour_escapes(terminal):
    term = terminal(120, 40, NO_COLOR="1")
    proc = start(term)
    wait_for_monitor(term)
    # Let a few ticks repaint (three different sample times seen): each must stay colourless.
    seen = set()

    def repainted() -> bool:
        seen.add(header_time(term.capture()))
        return len(seen - {None}) >= 3

    wait_for(repainted, timeout=SLOW, interval=0.2)
    raw = term.capture(escapes=True)
    assert shows_monitor(raw)
    assert not COLOUR_SGR.search(raw), repr(COLOUR_SGR.search(raw).group())
    assert "\x1b[" not in raw  # nor any other attribute
    quit_and_check_shell(term, proc)


def test_colour_is_there_without_no_color(terminal):
    """The check above can fail: without NO_COLOR the same capture carries colours."""
    term = terminal(120, 40)
    proc = start(term)
    wait_for_monitor(term)
    assert COLOUR_SGR.search(term.capture(escapes=True))
    quit_and_check_shell(term, proc)


def test_terminal_hangup_ends_gputop_and_its_demo(terminal):
    """An SSH drop: the terminal goes away under the running monitor."""
    term = terminal(120, 40)
    proc = start(term)
    wait_for_monitor(term)
    standins = descendants(proc)
    assert standins
    term.kill()  # the pty closes: SIGHUP, then reads and writes fail
    proc.wait(timeout=SLOW)
    wait_for(lambda: gone(standins), timeout=SLOW)


def test_sigterm_restores_the_terminal(terminal):
    term = terminal(100, 30)
    proc = start(term)
    wait_for_monitor(term)
    standins = descendants(proc)
    proc.terminate()
    proc.wait(timeout=SLOW)
    wait_for(lambda: "exit=143" in term.capture(), timeout=SLOW)
    term.type("echo shell-ok-$((6*7))")
    wait_for(lambda: "shell-ok-42" in term.capture(), timeout=SLOW)
    wait_for(lambda: gone(standins), timeout=SLOW)


def test_without_a_terminal_it_says_so_in_one_line():
    result = run_cli("--demo", "tour", stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "needs a terminal" in result.stderr
    assert "Traceback" not in result.stderr


def installed_gputop() -> str:
    """The `gputop` command that the README's install made for this checkout (pip install -e);
    skips when the tests run without it (from PYTHONPATH alone)."""
    script = Path(sys.executable).with_name("gputop")
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", "import gputop; print(gputop.__file__)"],
                           env=env, cwd="/", capture_output=True, text=True, timeout=SLOW)
    if not script.exists() or not found.stdout.strip().startswith(str(REPO)):
        pytest.skip("needs this checkout installed with `pip install -e .` (the README's install)")
    return str(script)


def test_the_demo_started_beside_its_checkout_trains_and_p_diagnoses(terminal, tmp_path,
                                                                     monkeypatch):
    """Acceptance: cd to the folder that holds the checkout (so it holds a `gputop/` folder),
    then `gputop --demo input-starved`: the trainer runs and `p` gives the diagnosis."""
    pytest.importorskip("torch")
    from tests.scripts.agent_testkit import private_runtime_dir, wait_for_steps

    script = installed_gputop()
    holder = tmp_path / "src"
    (holder / "gputop" / "gputop").mkdir(parents=True)  # a clone named gputop/ lies here
    runtime = private_runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    captures = tmp_path / "captures"
    term = terminal(120, 40, XDG_RUNTIME_DIR=str(runtime), GPUTOP_CAPTURE_DIR=str(captures))
    term.type(f"cd {holder} && unset PYTHONPATH && PS1='$ '")
    term.type(f"{script} --demo input-starved; echo exit=$?")
    proc = wait_for(term.gputop, timeout=SLOW)

    def trainer() -> psutil.Process | None:
        for p in proc.children():  # its DataLoader workers have the same command line
            try:
                if "gputop.demo.train" in p.cmdline():
                    return p
            except psutil.Error:
                pass
        return None

    pid = wait_for(trainer, timeout=SLOW).pid
    wait_for_steps(pid, steps=1, timeout=2 * SLOW)  # torch imported, training
    # The cursor starts on GPU 0's process, the trainer, once the table shows it.
    wait_for(lambda: re.search(rf"^ › +0 +{pid} .*gputop\.demo\.train", term.capture(), re.M),
             timeout=SLOW, interval=0.2)
    assert "not visible" not in term.capture()
    term.keys("p")
    wait_for(lambda: f"diagnosis of pid {pid}: dataloader-stall" in term.capture(),
             timeout=2 * SLOW, interval=0.2)
    assert any(captures.glob("*.pt.trace.json.gz"))
    term.keys("Escape")
    wait_for(lambda: "diagnosis of pid" not in term.capture(), timeout=SLOW)
    term.keys("q")
    proc.wait(timeout=SLOW)
    wait_for(lambda: "exit=0" in term.capture(), timeout=SLOW)
    shutil.rmtree(runtime, ignore_errors=True)


# select(2)'s system call numbers (glibc calls pselect6) by machine.
SELECT_CALLS = {"x86_64": {"23", "270"}, "aarch64": {"72"}}


def _select_thread(proc: psutil.Process) -> int | None:
    """The thread of ``proc`` waiting in select(2): Textual's input thread (asyncio waits in
    epoll_wait, the others in futexes or sleeps)."""
    calls = SELECT_CALLS[platform.machine()]
    for thread in proc.threads():
        try:
            with open(f"/proc/{proc.pid}/task/{thread.id}/syscall") as f:
                if f.read().split()[0] in calls:
                    return thread.id
        except (OSError, IndexError):
            continue
    return None


def _wakeups(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f
                    if line.startswith("voluntary_ctxt_switches"))


def test_the_input_thread_sleeps_until_a_key_comes(terminal):
    """Textual's input thread woke 10 times a second to poll for its exit and the escape
    key's timeout (~5 % of the monitor's CPU): gputop's waits in select until a key, the
    timeout or the exit wakes it; keys, a lone Escape (the timeout) and q still work."""
    if platform.machine() not in SELECT_CALLS:
        pytest.skip(f"select's system call number on {platform.machine()} is not known here")
    term = terminal(160, 50)
    proc = start(term)
    wait_for_monitor(term)
    tid = wait_for(lambda: _select_thread(proc), timeout=SLOW)
    before = _wakeups(proc.pid, tid)
    time.sleep(3.0)
    woke = _wakeups(proc.pid, tid) - before
    assert woke < 10, f"the input thread woke {woke} times in 3 s without a key"
    term.keys("f")
    wait_for(lambda: "findings:" in term.capture().splitlines()[0], timeout=SLOW)
    term.keys("Escape")
    wait_for(lambda: shows_monitor(term.capture()), timeout=SLOW)
    quit_and_check_shell(term, proc)
