"""How long `gputop capture` takes end to end, and how fast its failures are reported: the
figures the capture tests check the outcome of (tests/test_capture_cli.py,
tests/test_agent_server.py) without timing it.

With a private agent socket directory, a small CPU training job (tests/scripts/
slow_loader_train.py, ~30 ms steps, the DataLoader the bottleneck) is started with `gputop run`.
It prints, each as the median and worst of ``--runs``:
- capture: `gputop capture PID --steps 3 --json` from the command's start to its exit (Python
  start-up, the warm-up and 3 recorded steps, the trace export and the analysis; goal < 30 s);
- exited mid-capture: a job that ends during a 500-step capture, from the job's exit to the
  command reporting it (the capture's --timeout is far longer, so a late report would show);
- hung agent: `agent_status(pid, timeout=0.3)` against a socket that listens and never answers
  (the monitor calls it every tick, so it must return at its timeout).

Usage: python benchmarks/bench_capture_cli.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "tests" / "scripts" / "slow_loader_train.py"
TIMEOUT_S = 240.0


def gputop(*args: str) -> list[str]:
    return [sys.executable, "-m", "gputop", *args]


def end(proc: subprocess.Popen) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(tree, timeout=30)
    proc.wait()


def wait_steps(pid: int, steps: int) -> None:
    from gputop.agent.client import agent_status

    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        status = agent_status(pid, timeout=10.0)
        if status and (status.get("steps") or 0) >= steps:
            return
        time.sleep(0.1)
    raise TimeoutError(f"job {pid} did not reach {steps} steps")


def capture_s(env: dict[str, str]) -> float:
    job = subprocess.Popen(gputop("run", "--", sys.executable, str(TRAIN), "--steps", "0",
                                  "--item-ms", "3"),
                           env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_steps(job.pid, 2)
        t0 = time.monotonic()
        done = subprocess.run(gputop("capture", str(job.pid), "--steps", "3", "--json"),
                              env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        took = time.monotonic() - t0
        if done.returncode != 0:
            raise RuntimeError(f"capture failed: {done.stderr.strip()}")
        return took
    finally:
        end(job)


def exit_report_s(env: dict[str, str]) -> float:
    job = subprocess.Popen(gputop("run", "--", sys.executable, str(TRAIN), "--steps", "60",
                                  "--item-ms", "3"),
                           env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_steps(job.pid, 2)
        cli = subprocess.Popen(gputop("capture", str(job.pid), "--steps", "500", "--timeout",
                                      str(int(TIMEOUT_S))),
                               env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        try:
            job.wait(TIMEOUT_S)
            exited = time.monotonic()
            _, err = cli.communicate(timeout=TIMEOUT_S)
            took = time.monotonic() - exited
            if "exited during the capture" not in err:
                raise RuntimeError(f"unexpected: {err.strip()}")
            return took
        finally:
            end(cli)
    finally:
        end(job)


def hung_status_s(runtime: Path) -> float:
    from gputop.agent import client

    directory = client.socket_dir(create=True)
    path = directory / f"{os.getpid()}.sock"
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(path))
    hung.listen(1)
    try:
        t0 = time.monotonic()
        assert client.agent_status(os.getpid(), timeout=0.3) is None
        return time.monotonic() - t0
    finally:
        hung.close()
        path.unlink(missing_ok=True)


def show(name: str, values: list[float], goal: str = "") -> None:
    print(f"  {name:20s} median {statistics.median(values):6.2f} s  worst {max(values):6.2f} s"
          f"{f'  ({goal})' if goal else ''}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runtime = Path(tempfile.mkdtemp(prefix="gputop-bench-xdg-"))
    os.chmod(runtime, 0o700)
    captures = runtime / "captures"
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # the client in this process looks there
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), GPUTOP_CAPTURE_DIR=str(captures),
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    sys.path.insert(0, str(REPO))
    results: dict[str, list[float]] = {"capture": [], "exited mid-capture": [], "hung agent": []}
    try:
        for run in range(args.runs):
            results["capture"].append(capture_s(env))
            results["exited mid-capture"].append(exit_report_s(env))
            results["hung agent"].append(hung_status_s(runtime))
            print(f"run {run + 1}: " + "  ".join(f"{k} {v[-1]:.2f} s"
                                                  for k, v in results.items()), flush=True)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    print(f"gputop capture, {args.runs} run(s) ({psutil.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}):")
    show("capture (3 steps)", results["capture"], "goal < 30 s")
    show("exited mid-capture", results["exited mid-capture"], "from the job's exit")
    show("hung agent", results["hung agent"], "timeout 0.3 s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
