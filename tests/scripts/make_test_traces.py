"""Make the small real traces in tests/data/ that the tests of gputop's own screens and of
`gputop analyze DIR` read, so those tests run on a fresh clone (without ../shared).

Run from the repository root: ``python -m tests.scripts.make_test_traces``. Every trace is a
real torch.profiler recording of a real CPU training run, taken the way a user takes one:

* ``demo_input_starved.pt.trace.json.gz``: `gputop capture` of the demo's own trainer
  (``python -m gputop.demo.train``, the process `p` captures in `gputop --demo input-starved`),
  3 steps, made small (batch 4, 6 blur passes, no Python stacks): the DataLoader starves it;
* ``ddp2/rank0.pt.trace.json.gz``, ``ddp2/rank1.pt.trace.json.gz``: `gputop capture --job` of
  a 2-rank gloo DDP job under torchrun (tests/scripts/ddp_train.py) whose rank 1 reads its
  samples 6 ms slower: the ranks of one job, with rank 1 the straggler.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import REPO, SLOW, wait_for
from tests.scripts.agent_testkit import (
    SCRIPTS,
    gputop_run,
    private_agent_world,
    running,
    wait_for_steps,
)

DATA = REPO / "tests" / "data"


def _capture(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gputop", "capture", *args, "--no-with-stack"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=2 * SLOW)
    if done.returncode != 0:
        raise SystemExit(f"capture failed: {done.stderr}")


def demo_trace(env: dict[str, str], out: Path) -> Path:
    job = [sys.executable, "-m", "gputop.demo.train", "--num-workers", "0", "--batch-size", "4",
           "--transform-passes", "6"]
    with running(gputop_run(job, env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)) as proc:
        wait_for_steps(proc.pid, steps=3)
        _capture(env, str(proc.pid), "--steps", "3", "--out", str(out))
    (trace,) = out.glob("*.pt.trace.json.gz")
    return trace


def ddp_traces(env: dict[str, str], out: Path) -> list[Path]:
    from gputop.client.agents import AgentError
    from gputop.client.jobs import find_job

    job = ["torchrun", "--nproc-per-node", "2", str(SCRIPTS / "ddp_train.py"),
           "--slow-rank", "1", "--slow-ms", "6", "--sample-ms", "1"]
    with running(gputop_run(job, env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)) as proc:
        def ready() -> bool:
            try:
                ranks = find_job(proc.pid).ranks
            except AgentError:
                return False
            return len(ranks) == 2 and min(r.steps for r in ranks) >= 5

        wait_for(ready, timeout=2 * SLOW, interval=0.5)
        _capture(env, "--job", str(proc.pid), "--steps", "3", "--out", str(out))
    traces = sorted(out.glob("job-*/*.pt.trace.json.gz"))
    assert len(traces) == 2, traces
    return traces


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="gputop-test-traces-"))
    try:
        with private_agent_world(work / "captures") as (env, _):
            demo = demo_trace(env, work / "demo")
            ranks = ddp_traces(env, work / "ddp")
        DATA.joinpath("ddp2").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(demo, DATA / "demo_input_starved.pt.trace.json.gz")
        for trace in ranks:
            rank = json.loads(gzip.decompress(trace.read_bytes()))["distributedInfo"]["rank"]
            shutil.copyfile(trace, DATA / "ddp2" / f"rank{rank}.pt.trace.json.gz")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for path in sorted(DATA.rglob("*.json.gz")):
        print(f"{path.relative_to(REPO)}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
