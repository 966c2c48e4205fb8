"""torch.compile's health, live (issue 41): real compiled CPU jobs under `gputop run`, one
`gputop watch --json` over them all.

The jobs (tests/scripts/compile_jobs.py) share one module fixture: a batch size that changes
every 10 steps (aot_eager: recompiles), `.item()` in forward and a Python `if` on a tensor
(eager: graph breaks), a recompile limit of 2 that is hit (compile-fallback), and a healthy
inductor job (one compile, then nothing to say).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from gputop.client.agents import agent_status
from tests.conftest import REPO, SLOW, end_popen, wait_for
from tests.scripts.agent_testkit import ANSWER_S, gputop_run, private_agent_world

JOBS = REPO / "tests" / "scripts" / "compile_jobs.py"
COMPILE_IDS = {"recompiles", "graph-breaks", "compile-fallback", "compile-stall",
               "cudagraph-rerecord"}
CASES = {"batch": "aot_eager", "item": "eager", "branch": "eager", "limit": "eager",
         "healthy": "inductor"}


def _line_of(marker: str) -> int:
    lines = JOBS.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


class Watch:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gputop", "watch", "--json"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=REPO)
        self.events: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def raised(self, finding_id: str, pid: int) -> dict | None:
        return next((e for e in list(self.events) if e["id"] == finding_id
                     and e["state"] == "raised" and e["pid"] == pid), None)


@pytest.fixture(scope="module")
def world(tmp_path_factory, share_process):
    with private_agent_world(tmp_path_factory.mktemp("captures"),
                             OMP_NUM_THREADS="1") as (env, _):
        # A cache of its own: no compiled artefacts or remembered dynamic sizes of other runs.
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor"))
        jobs = {case: share_process(gputop_run(
            [sys.executable, str(JOBS), case, "--backend", backend, "--seconds", "400",
             "--step-ms", "50"], env, stderr=subprocess.DEVNULL))
            for case, backend in CASES.items()}
        watch = Watch(env)
        watch.env = env
        share_process(watch.proc)
        try:
            yield jobs, watch
        finally:
            end_popen(watch.proc)
            for job in jobs.values():
                end_popen(job)


def world_env(world) -> dict[str, str]:
    return world[1].env


def _compile_status(pid: int) -> dict | None:
    status = agent_status(pid, timeout=ANSWER_S)
    return (status or {}).get("compile")


@pytest.mark.timeout(6 * SLOW)
def test_recompiles_name_function_line_and_dim(world):
    jobs, watch = world
    pid = jobs["batch"].pid
    found = wait_for(lambda: watch.raised("recompiles", pid), timeout=4 * SLOW, interval=0.5)
    line = _line_of("def forward")
    assert f"compile_jobs.py:{line} `forward`" in found["evidence"], found
    assert "size of `x` dim 0 changed 32 -> 17" in found["evidence"], found
    assert "drop_last=True" in found["fix"] and "mark_dynamic" in found["fix"]
    # How soon after the first recompile (printed, not asserted: a loaded machine is slower).
    status = _compile_status(pid) or {}
    first = min((e["t"] for e in status.get("events", []) if e["kind"] == "recompile"),
                default=None)
    if first is not None:
        print(f"recompiles raised {found['time'] - first:.1f} s after the first recompile")


@pytest.mark.timeout(6 * SLOW)
def test_graph_break_on_item_names_line_and_reason(world):
    jobs, watch = world
    found = wait_for(lambda: watch.raised("graph-breaks", jobs["item"].pid), timeout=4 * SLOW,
                     interval=0.5)
    assert f"call to `Tensor.item()` at compile_jobs.py:{_line_of('ITEM-LINE')}" in \
        found["evidence"], found
    assert "capture_scalar_outputs" in found["fix"]
    # The agent's own wrapper of Tensor.item() is not reported as a break of its own.
    assert "torch_hooks" not in found["evidence"]


@pytest.mark.timeout(6 * SLOW)
def test_graph_break_on_python_if_names_line(world):
    jobs, watch = world
    found = wait_for(lambda: watch.raised("graph-breaks", jobs["branch"].pid),
                     timeout=4 * SLOW, interval=0.5)
    assert f"Python `if` on a tensor at compile_jobs.py:{_line_of('BRANCH-LINE')}" in \
        found["evidence"], found
    assert "torch.where" in found["fix"] or "torch.cond" in found["fix"]


@pytest.mark.timeout(6 * SLOW)
def test_recompile_limit_hit_is_a_fallback(world):
    jobs, watch = world
    found = wait_for(lambda: watch.raised("compile-fallback", jobs["limit"].pid),
                     timeout=4 * SLOW, interval=0.5)
    assert "`forward`" in found["evidence"] and "recompile_limit (2)" in found["evidence"]
    assert "eager" in found["evidence"]


@pytest.mark.timeout(8 * SLOW)
def test_healthy_compiled_job_raises_nothing(world):
    jobs, watch = world
    pid = jobs["healthy"].pid

    def warmed_up() -> dict | None:
        status = agent_status(pid, timeout=ANSWER_S)
        compiled = (status or {}).get("compile")
        return status if compiled and compiled["compiles"] >= 1 and status["steps"] >= 20 \
            else None

    status = wait_for(warmed_up, timeout=6 * SLOW, interval=0.5)
    # A while past its warm-up with the watch looking (its rules raise after 4 s of a condition).
    time.sleep(15)
    assert not [e for e in watch.events if e["pid"] == pid and e["id"] in COMPILE_IDS]
    compiled = agent_status(pid, timeout=ANSWER_S)["compile"]
    assert compiled["recompiles"] == 0 and compiled["graph_breaks"] == 0, compiled
    assert compiled["functions"][0]["function"] == "forward"
    assert status["flops"].get("last", {}).get("error") in (None, "unsupported")


@pytest.mark.timeout(6 * SLOW)
def test_snapshot_json_lists_compiled_functions(world):
    jobs, watch = world
    pid = jobs["limit"].pid
    wait_for(lambda: watch.raised("compile-fallback", pid), timeout=4 * SLOW, interval=0.5)
    result = subprocess.run([sys.executable, "-m", "gputop", "snapshot", "--json"],
                            capture_output=True, text=True, timeout=SLOW, cwd=REPO,
                            env=dict(world_env(world)))
    assert result.returncode == 0, result.stderr
    procs = {p["pid"]: p for p in json.loads(result.stdout)["processes"]}
    compiled = procs[pid]["compiled"]
    assert compiled["fallbacks"] >= 1 and compiled["recompiles"] >= 1
    forward = next(f for f in compiled["functions"] if f["function"] == "forward")
    assert forward["fallback"] is True and forward["line"] == _line_of("def forward")
    text = subprocess.run([sys.executable, "-m", "gputop", "snapshot"], capture_output=True,
                          text=True, timeout=SLOW, cwd=REPO, env=dict(world_env(world)))
    assert "torch.compile:" in text.stdout and "hit the limit, runs eager" in text.stdout
