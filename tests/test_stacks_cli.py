"""`gputop stacks PID` on real plain training jobs (no agent, not started by gputop): the named
function that burns the CPU comes out on top, with its line and share, whether it runs in the
DataLoader (num_workers=0 or in workers) or in the main loop; a hung process shows every
thread's whole stack; `gputop watch` prints where a stall is. Failures are one line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

import pytest

from tests.busy_host import shows
from tests.conftest import REPO, SLOW, cli_env, end_popen, run_cli, wait_for
from tests.scripts.stacks_testkit import stacks_readable  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.timeout(4 * SLOW), pytest.mark.usefixtures("stacks_readable")]

TRAIN = REPO / "tests" / "scripts" / "plain_train.py"


def hot_lines(function: str) -> set[int]:
    """The lines of plain_train.py marked as where ``function`` spends its time."""
    lines = TRAIN.read_text().splitlines()
    return {n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# hot: {function}")}


def start_job(*args: str) -> subprocess.Popen:
    """A plain `python plain_train.py` (nothing of gputop in it), once it trains."""
    job = subprocess.Popen([sys.executable, str(TRAIN), *args], stdout=subprocess.PIPE,
                           text=True, env=cli_env(OMP_NUM_THREADS="1"), cwd=REPO)
    line = job.stdout.readline()
    assert "training" in line, line
    return job


@pytest.fixture(scope="module")
def loader_job():
    job = start_job("--hot", "loader")
    yield job
    end_popen(job)


@pytest.fixture(scope="module")
def loop_job():
    job = start_job("--hot", "loop")
    yield job
    end_popen(job)


def stacks(pid: int, *args: str) -> dict:
    done = run_cli("stacks", str(pid), "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_top(report: dict, pid: int, function: str, role: str = "main") -> dict:
    top = report["top"]
    assert top is not None, report
    assert top["function"] == function, top
    assert top["file"] == str(TRAIN) and top["line"] in hot_lines(function), top
    assert top["share"] >= 0.5 and top["samples"] > 0, top
    assert top["role"] == role
    if role == "main":
        assert top["pid"] == pid
    return top


def test_the_dataloader_function_of_a_num_workers_0_job_is_the_top_entry(loader_job):
    report = stacks(loader_job.pid, "--seconds", "3")
    assert report["pid"] == loader_job.pid and report["seconds"] == 3.0
    assert_top(report, loader_job.pid, "decode_sample")
    main = report["processes"][0]
    assert main["role"] == "main" and len(report["processes"]) == 1  # num_workers=0
    assert main["top_functions"][0]["function"] == "decode_sample"
    assert main["active_share"] > 0.5  # CPU-bound: it loads between steps
    now = main["threads_now"][0]["stack"]
    assert any(f["function"] == "SlowDataset.__getitem__" for f in now)


def test_the_slow_function_of_a_main_loop_is_the_top_entry(loop_job):
    report = stacks(loop_job.pid, "--seconds", "3")
    assert_top(report, loop_job.pid, "update_running_metrics")


def test_the_human_report_names_the_function_and_line(loader_job):
    done = run_cli("stacks", str(loader_job.pid), "--seconds", "1")
    assert done.returncode == 0, done.stderr
    where = next(line for line in done.stdout.splitlines() if line.startswith("where: "))
    found = re.match(r"where: decode_sample \(plain_train\.py:(\d+)\), (\d+) % of "
                     r"main-process samples", where)
    assert found and int(found.group(1)) in hot_lines("decode_sample"), where
    assert f"main process {loader_job.pid}:" in done.stdout and "top functions" in done.stdout


def test_dataloader_workers_are_sampled_per_process():
    job = start_job("--hot", "loader", "--workers", "1")
    try:
        report = stacks(job.pid, "--seconds", "2")
        workers = [p for p in report["processes"] if p["role"] == "worker"]
        assert workers, report["processes"]
        assert_top(report, job.pid, "decode_sample", role="worker")
        busiest = max(workers, key=lambda p: p["active_samples"])
        assert busiest["top_functions"][0]["function"] == "decode_sample"
        # Per thread: the worker's main thread runs, its helper threads wait.
        assert busiest["thread_activity"][0]["active_share"] > 0.5
    finally:
        end_popen(job)


def test_a_hung_process_shows_every_thread_whole(spawn):
    code = ("import threading, time\n"
            "def wait_for_peer(event):\n"
            "    event.wait()\n"
            "threading.Thread(target=time.sleep, args=(600,), name='heartbeat').start()\n"
            "print('ready', flush=True)\n"
            "wait_for_peer(threading.Event())\n")
    hung = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert hung.stdout.readline().strip() == "ready"
    report = stacks(hung.pid, "--seconds", "1")
    main = report["processes"][0]
    assert main["active_share"] < 0.05
    names = {t["name"] for t in main["threads_now"]}
    assert {"MainThread", "heartbeat"} <= names
    stack = [f["function"] for f in next(t["stack"] for t in main["threads_now"]
                                         if t["name"] == "MainThread")]
    assert "wait" in stack[0] and "wait_for_peer" in stack, stack  # innermost first
    text = run_cli("stacks", str(hung.pid), "--seconds", "1").stdout
    assert "idle the whole time: whole stacks" in text and "wait_for_peer" in text


def one_line_error(done: subprocess.CompletedProcess, code: int, *words: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_failures_are_one_line(spawn):
    sleeper = spawn(["sleep", "120"])
    wait_for(lambda: open(f"/proc/{sleeper.pid}/cmdline", "rb").read().startswith(b"sleep"),
             timeout=SLOW)
    one_line_error(run_cli("stacks", str(sleeper.pid), "--seconds", "1"), 1,
                   "not a Python process")
    one_line_error(run_cli("stacks", "4194999"), 1, "no process with pid 4194999")
    one_line_error(run_cli("stacks", str(sleeper.pid), env=cli_env(GPUTOP_PY_SPY="")), 1,
                   "py-spy is not installed", "pip install py-spy")
    one_line_error(run_cli("stacks", "abc"), 2, "PID must be a process id")
    one_line_error(run_cli("stacks", str(sleeper.pid), "--seconds", "0"), 2, "--seconds")


def test_watch_prints_where_the_stall_is(loader_job):
    """The job stands on the demo's GPU 0 (GPUTOP_DEMO_PIDS), loading in its loop without the
    agent: host-bound raises (from outside, loading and other Python read the same), then a
    `where` line names the function: the loader's."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "gputop", "--demo", "input-starved", "watch", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=cli_env(GPUTOP_DEMO_PIDS=f"0:{loader_job.pid}"))
    events: list[dict] = []
    reader = threading.Thread(target=lambda: events.extend(json.loads(line)
                                                           for line in watch.stdout),
                              daemon=True)
    reader.start()
    try:
        def located() -> dict | None:
            return next((e for e in events if e["state"] == "where"), None)

        event = wait_for(located, timeout=2 * SLOW, interval=0.2)
        # host-bound, or on a busy host cpu-contention with it as an effect (tests/busy_host.py)
        assert event["id"] in ("host-bound", "cpu-contention") and event["pid"] == loader_job.pid
        assert event["where"].startswith("decode_sample (plain_train.py:"), event
        raised = next(e for e in events if e["state"] == "raised" and e["id"] == event["id"])
        assert shows(raised, "host-bound"), raised
        assert "where" not in raised  # it is sampled after the raise, then told
        watch.send_signal(signal.SIGINT)
        assert watch.wait(SLOW) == 130
        reader.join(SLOW)
    finally:
        end_popen(watch)
