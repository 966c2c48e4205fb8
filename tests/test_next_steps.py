"""Every command a finding prints as its next step runs as printed.

External tools (nsys, ncu, rocprofv3, py-spy, nvidia-smi) are checked against the table of
documented flags in gputop/diagnostics/next_steps.py; gputop's own commands are checked against
gputop's parser, and the one the input-starved demo's training job gets is run as printed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gputop.cli import build_parser
from gputop.diagnostics.next_steps import APP, check_command
from tests.busy_host import shows
from tests.conftest import DATA, DEMO_TRACE, REPO, SLOW, cli_env, end_popen, run_cli, wait_for
from tests.scripts.agent_testkit import private_runtime_dir


def parses(command: str) -> None:
    """A gputop command line parses (argparse exits on anything it does not know)."""
    words = shlex.split(command)
    assert words[0] == "gputop"
    build_parser().parse_args(words[1:])


def test_known_bad_forms_are_refused():
    # What earlier versions printed, or what the tools no longer accept.
    assert check_command("nsys profile --sample=cpu --output=x python train.py")
    assert check_command("nsys profile --pid 42 --output=x")
    assert check_command("py-spy dump --pid 42 --duration 5")
    assert check_command("ncu --set default --export x python train.py")
    assert check_command("nsys analyze -r not_a_rule x.nsys-rep")
    assert not check_command("py-spy dump --pid 42 --native")


@pytest.mark.timeout(3 * SLOW)
def test_live_next_steps_of_every_demo_scenario_are_valid():
    """Each scenario's findings, as `gputop watch --json` prints them (the five at once: each
    waits out its 20 s)."""
    scenarios = ("tour", "input-starved", "host-sync", "pcie-bound", "memory-leak")
    with ThreadPoolExecutor(len(scenarios)) as pool:
        runs = list(pool.map(lambda scenario: run_cli(
            "--demo", scenario, "watch", "--json", "--duration", "20", timeout=2 * SLOW),
            scenarios))
    for scenario, proc in zip(scenarios, runs):
        assert proc.returncode == 0, proc.stderr
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        assert events, scenario
        for e in events:
            assert check_command(e["next_step"]) == [], (scenario, e["id"], e["next_step"])
            if e["next_step"].startswith("gputop"):
                parses(e["next_step"])


@pytest.mark.timeout(5 * SLOW)
def test_the_capture_a_live_finding_suggests_runs_as_printed(tmp_path, monkeypatch):
    """input-starved's GPU 0 is a real torch job with the agent: its dataloader-stall says
    `gputop capture PID --steps 3`; run exactly that, and check the capture's own next steps
    name the real process (its pid, its command line), not a placeholder."""
    pytest.importorskip("torch")
    runtime = private_runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("GPUTOP_CAPTURE_DIR", str(tmp_path / "captures"))
    watch = subprocess.Popen(
        [sys.executable, "-m", "gputop", "--demo", "input-starved", "watch", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO)
    events: list[dict] = []
    reader = threading.Thread(target=lambda: events.extend(json.loads(x) for x in watch.stdout),
                              daemon=True)
    reader.start()
    try:
        stall = wait_for(lambda: next((e for e in events if shows(e, "dataloader-stall")), None),
                         timeout=2 * SLOW, interval=0.2)
        command = stall["next_step"]
        if stall["id"] == "cpu-contention":  # a busy host: the stall is its effect
            assert check_command(command) == [], command
            command = f"gputop capture {stall['pid']} --steps 3"  # the stall's own next step
        assert command == f"gputop capture {stall['pid']} --steps 3", command
        words = shlex.split(command)
        done = subprocess.run([sys.executable, "-m", "gputop", *words[1:], "--json"],
                              capture_output=True, text=True, env=cli_env(), cwd=REPO,
                              timeout=2 * SLOW)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["verdict"] == "dataloader-stall"
        for f in result["findings"]:
            assert check_command(f["next_step"]) == [], f["next_step"]
            if f["next_step"].startswith("gputop"):
                parses(f["next_step"])
        # With the process known, nothing is a placeholder: py-spy attaches to the pid and
        # profilers relaunch the job's own command line.
        steps = [f["next_step"] for f in result["findings"]]
        assert steps and not any(APP in c for c in steps), steps
        assert any(f"--pid {stall['pid']}" in c for c in steps), steps
    finally:
        end_popen(watch)
        reader.join(SLOW)


def test_a_cpu_only_trace_suggests_no_gpu_profiler():
    """The traces tests/data ships are real CPU runs: Nsight Systems, Nsight Compute and
    rocprofv3 would have no GPU to trace. Their next steps are py-spy's (with native frames
    where a GPU profiler would stand) and gputop's, valid as printed."""
    from gputop.diagnostics.trace.analysis import analyze_trace, compare_job

    ranks = [analyze_trace(p) for p in sorted((DATA / "ddp2").iterdir())]
    compare_job(ranks)  # the ranks of one job: the cross-rank findings join theirs
    analyses = [analyze_trace(DEMO_TRACE), *ranks]
    steps = {f.id: f.next_step for a in analyses for f in a.findings}
    assert {"launch-bound", "communication", "dataloader-stall"} <= set(steps), steps
    for fid, step in steps.items():
        assert not {"nsys", "ncu", "rocprofv3"} & set(shlex.split(step)), (fid, step)
        assert check_command(step) == [], (fid, step)
        if step.startswith("gputop"):
            parses(step)
    assert steps["launch-bound"].startswith("py-spy record") and "--native" in steps["launch-bound"]
