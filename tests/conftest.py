"""Shared test helpers: run the real CLI in a subprocess, find ../shared, wait on conditions,
and make sure no process a test starts outlives it.

Waits are on conditions, with generous timeouts: a loaded machine makes things slower, never
wrong, so no test asserts how long something took (benchmarks/ measures and prints that).

Processes: every process the tests start inherits ``GPUTOP_TEST_RUN`` (this pytest run) and,
while a test runs, ``GPUTOP_TEST_CASE`` (that test) in its environment. Start processes with
the ``spawn`` fixture (or a fixture or context manager of your own that ends them); whatever a
test still leaves running is found by those marks (even after it was re-parented, like a tmux
server or a stand-in whose parent died) or as a new child of pytest, and killed, with its whole
tree, when the test ends, pass or fail; and once more at the end of the run. What the sweep had
to end is listed in the terminal summary. A server that a module-scoped fixture shares between
tests (Prometheus, sshd) is registered with the ``share_process`` fixture and ended by its
fixture.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"
# Small real traces the tests ship (tests/scripts/make_test_traces.py made them): the tests of
# gputop's own screens read these, so they run on a fresh clone without ../shared.
DATA = REPO / "tests" / "data"
DEMO_TRACE = DATA / "demo_input_starved.pt.trace.json.gz"

# Time allowed for anything that starts a Python process importing torch or Textual, or waits
# on one: generous, so that a machine busy with other work still passes.
SLOW = 120.0

RUN_MARK = "GPUTOP_TEST_RUN"
CASE_MARK = "GPUTOP_TEST_CASE"
os.environ[RUN_MARK] = uuid.uuid4().hex
os.environ.pop(CASE_MARK, None)

# Discovery scope (issue 38): this run's agents listen in a private directory of its own, and
# every gputop the tests start looks for agents only there ($GPUTOP_SOCKET_DIR, inherited by
# every process the tests start). Other users' agents, the developer's own `gputop run` job
# and hostile agents elsewhere on the host are invisible to the tests, so they cannot change a
# result. A test that needs the default directories (or another user's) removes the variable
# with monkeypatch (``monkeypatch.delenv(SOCKET_DIR_ENV)``) and is written so that foreign
# agents cannot change its result.
SOCKET_DIR_ENV = "GPUTOP_SOCKET_DIR"
SOCKET_SCOPE = tempfile.mkdtemp(prefix="gputop-tests-")  # mode 0700, ours
os.environ[SOCKET_DIR_ENV] = SOCKET_SCOPE

_swept: list[tuple[str, str]] = []  # (test, process) ended by the sweep, for the summary
# Processes that a module-scoped fixture owns (servers shared by several tests): they and
# everything under them outlive each test, and the fixture ends them itself.
_shared: set[psutil.Process] = set()

# Started in the background of a non-interactive shell (`pytest &`, nohup, some CI runners), the
# test run inherits SIGINT ignored, and so would every process it starts: Ctrl-C sent to a child
# (`gputop watch` exits 130, a job under `gputop run` gets KeyboardInterrupt) would do nothing.
# Python's own handler here puts SIGINT back to its default in every child (at exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for running `python -m gputop` from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = SLOW, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputop", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=kw.pop("env", None) or cli_env(),
        cwd=kw.pop("cwd", REPO),
        **kw,
    )


def wait_for(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.05):
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition}")
        time.sleep(interval)


# -- ending processes ------------------------------------------------------------------------


def _tree(procs: Iterable[psutil.Process]) -> dict[int, psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for proc in procs:
        try:
            found[proc.pid] = proc
            for child in proc.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            pass
    return found


def end_processes(procs: Iterable[psutil.Process], timeout: float = 30.0) -> None:
    """SIGKILL these processes and every process under them, and wait until they are gone.

    The trees are listed before anything is killed (a dead parent's children are re-parented
    and could no longer be found under it), and listed again in case one forked meanwhile."""
    me = os.getpid()
    victims: dict[int, psutil.Process] = {}
    pending = [p for p in procs if p.pid != me]
    for _ in range(3):
        tree = {pid: p for pid, p in _tree(pending).items() if pid != me and pid not in victims}
        if not tree:
            break
        for proc in tree.values():
            try:
                proc.kill()  # psutil checks the pid still names the same process
            except psutil.Error:
                pass
        victims.update(tree)
        pending = list(tree.values())
    # Our own children are reaped here; others are waited on until they are gone or zombies
    # (dead: a zombie waits on its parent, which may be a hung rank that never reaps it).
    alive = list(victims.values())
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.2)
        alive = [p for p in alive if not _zombie(p)]


def _zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True  # gone


def end_popen(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """End a Popen and its whole tree, reap it and close its pipes."""
    try:
        end_processes([psutil.Process(proc.pid)], timeout=timeout)
    except psutil.NoSuchProcess:
        pass
    if proc.poll() is None:  # only if psutil could not see it at all
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except (OSError, ValueError):
                pass


def marked(name: str, value: str) -> list[psutil.Process]:
    """Processes (not this one) whose environment has ``name=value``."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(name) == value:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def _children() -> dict[tuple[int, float], psutil.Process]:
    found = {}
    try:
        for proc in psutil.Process().children(recursive=True):
            try:
                found[(proc.pid, proc.create_time())] = proc
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return found


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(' '.join(proc.cmdline()).split())[:120]}"
    except psutil.Error:
        return str(proc.pid)


@pytest.fixture(scope="session")
def share_process():
    """``share_process(popen)``: mark a process that a module-scoped fixture starts (and must
    end) as shared by several tests; the per-test sweep leaves it and its children alone.

    A fixture, not a function to import: pytest loads this file as its own module, apart
    from ``tests.conftest`` as test modules import it, and only this instance sweeps."""

    def share(proc: subprocess.Popen) -> subprocess.Popen:
        try:
            _shared.add(psutil.Process(proc.pid))
        except psutil.NoSuchProcess:
            pass
        return proc

    return share


class Background:
    """A gputop command started now, its output going to files (no pipe fills while nobody
    reads it); ``result`` waits for it."""

    def __init__(self, folder: Path, name: str, *args: str) -> None:
        self.out, self.err = folder / f"{name}.out", folder / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "gputop", *args], stdout=out,
                                         stderr=err, text=True, env=cli_env(), cwd=REPO)

    def result(self, timeout: float) -> tuple[int, str, str]:
        code = self.proc.wait(timeout)
        return code, self.out.read_text(), self.err.read_text()


TOUR_RECORD_S = 60


@pytest.fixture(scope="session")
def tour_recording(tmp_path_factory, share_process):
    """60 s of `gputop --demo tour record` (its trainer counts its FLOPs once it steps: torch
    took 36 s to start on a loaded CI host, and 45 s left no FLOP count), recorded once for
    the tests that read it (the replay's, the efficiency report's), in the background from
    the first that asks:
    ``tour_recording.result(timeout)`` waits for it, ``.path`` is the recording."""
    folder = tmp_path_factory.mktemp("tour-recording")
    run = Background(folder, "record", "--demo", "tour", "--interval", "1", "record", "-o",
                     str(folder / "tour"), "--duration", str(TOUR_RECORD_S), "--flush-every",
                     "5")
    run.path = folder / "tour"
    share_process(run.proc)
    yield run
    end_popen(run.proc)


def _under_shared(proc: psutil.Process) -> bool:
    """Whether ``proc`` is a shared server or runs under one (a session of a shared sshd)."""
    roots = {root.pid for root in _shared if root.is_running()}
    if not roots:
        return False
    try:
        return proc.pid in roots or any(p.pid in roots for p in proc.parents())
    except psutil.ZombieProcess:
        return False  # ours to reap
    except psutil.Error:
        return True  # gone already: nothing to end


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request):
    """Mark what this test starts; end whatever of it still runs when the test is over."""
    mark = uuid.uuid4().hex
    before = set(_children())
    os.environ[CASE_MARK] = mark
    try:
        yield
    finally:
        os.environ.pop(CASE_MARK, None)
        left = {p.pid: p for p in marked(CASE_MARK, mark)}
        for key, proc in _children().items():
            if key not in before:  # a zombie too: waiting on it here reaps it
                left[proc.pid] = proc
        left = {pid: p for pid, p in left.items() if not _under_shared(p)}
        if left:
            _swept.extend((request.node.nodeid, _describe(p)) for p in left.values())
            end_processes(left.values())


def pytest_sessionfinish(session, exitstatus):
    left = {p.pid: p for p in marked(RUN_MARK, os.environ[RUN_MARK])}
    left.update({p.pid: p for p in _children().values()})
    if left:
        _swept.extend(("(end of the run)", _describe(p)) for p in left.values())
        end_processes(left.values())
    shutil.rmtree(SOCKET_SCOPE, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if _swept:
        terminalreporter.section("processes left running by tests (ended by conftest)")
        for test, proc in _swept:
            terminalreporter.line(f"{test}: {proc}")


@pytest.fixture
def spawn():
    """``proc = spawn([...], **popen_kwargs)``: a subprocess.Popen owned by the test. When the
    test ends, pass or fail, it and every process under it are killed and reaped."""
    started: list[subprocess.Popen] = []

    def start(args, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        end_popen(proc)


@pytest.fixture
def steady_agent_job(spawn):
    """A CPU-only training job under `gputop run` (so with the agent), 50 steps/s, no
    DataLoader; `gputop run` execs it, so the pid is the training process itself."""
    train = str(REPO / "tests" / "scripts" / "steady_train.py")
    job = spawn([sys.executable, "-m", "gputop", "run", "--", sys.executable, train,
                 "--seconds", "600", "--step-ms", "20"],
                env=cli_env(OMP_NUM_THREADS="1"), cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert job.stdout.readline().strip() == "training"
    return job


# -- the simulated driver --------------------------------------------------------------------


@pytest.fixture
def sim_clock():
    """A settable clock for the simulated driver: ``sim_clock.t = 12.0``."""

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    return Clock()


@pytest.fixture
def simulated(sim_clock):
    """Install a scenario's simulated NVML: ``sim = simulated('tour')``; uninstalled after."""
    from gputop.sim import nvml as simnvml
    from gputop.sim.scenarios import SCENARIOS

    def install(name: str, seed: int = 0):
        return simnvml.install(simnvml.SimulatedNvml(SCENARIOS[name], seed=seed, clock=sim_clock))

    yield install
    simnvml.uninstall()


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"96k"``) mounted on ``mount`` (made here), unmounted after: a disk
    that fills up. Skips the test where mounting is not allowed."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here: " + done.stderr.decode().strip())
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
