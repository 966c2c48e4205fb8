"""With the agent, a capture asked for the profiler's Python stacks (``--with-stack``) names the
source lines of the top host costs from them: on a real job through `gputop capture`, and on written traces
whose self times are known (nesting, C calls counted to their caller, broken nesting)."""

from __future__ import annotations

import json
import re

import pytest

from gputop.diagnostics.stack_lines import format_source_lines, top_source_lines
from tests.conftest import SLOW, run_cli
from tests.scripts.agent_testkit import (
    TRAIN,
    gputop_run,
    private_agent_world,
    running,
    train_cmd,
    wait_for_steps,
)

pytestmark = pytest.mark.timeout(4 * SLOW)

GETITEM_LINE = next(n for n, line in enumerate(TRAIN.read_text().splitlines(), 1)
                    if line.strip().startswith("def __getitem__"))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    captures = tmp_path_factory.mktemp("captures")
    with private_agent_world(captures) as (env, _):
        # A CPU-burning __getitem__ (num_workers=0): the DataLoader is the top host cost.
        proc = gputop_run(train_cmd("--steps", "0", "--item-ms", "4", "--cpu-transform"), env)
        with running(proc):
            wait_for_steps(proc.pid, steps=2)
            yield proc, env


def test_a_capture_names_the_source_line_of_the_dataloader(job):
    proc, env = job
    done = run_cli("capture", str(proc.pid), "--json", "--with-stack", "--no-stacks", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    costs = report["source_lines"]
    assert costs and costs[0]["cost"] == "DataLoader", costs
    top = costs[0]["lines"][0]
    assert top["frame"] == f"slow_loader_train.py({GETITEM_LINE}): __getitem__", top
    assert top["share"] > 0.5 and top["self_ms"] > 0
    human = run_cli("capture", str(proc.pid), "--with-stack", "--no-stacks", env=env)
    assert human.returncode == 0, human.stderr
    section = human.stdout.split("Source lines of the top host costs", 1)[1]
    assert re.search(r"DataLoader \([\d.]+ ms\):\n +[\d.]+ % +[\d.]+ ms  "
                     rf"slow_loader_train\.py\({GETITEM_LINE}\): __getitem__", section), section
    assert section.index("__getitem__") < section.index("\ntrace: ")


def test_with_dataloader_workers_the_line_is_the_users_loop_not_selectors(tmp_path):
    """The training process waits for its workers' batches in the standard library (selectors,
    multiprocessing) under torch's DataLoader: the line named is the user's, which asked."""
    with private_agent_world(tmp_path / "captures") as (env, _):
        proc = gputop_run(train_cmd("--steps", "0", "--item-ms", "4", "--cpu-transform",
                                    "--workers", "2"), env)
        with running(proc):
            wait_for_steps(proc.pid, steps=2)
            done = run_cli("capture", str(proc.pid), "--json", "--with-stack", env=env)
    assert done.returncode == 0, done.stderr
    costs = [c for c in json.loads(done.stdout)["source_lines"] if c.get("from") != "py-spy"]
    assert costs and costs[0]["cost"] == "DataLoader", costs
    top = costs[0]["lines"][0]
    # main was running when the profiler started: torch names it by the line it was on then.
    assert re.fullmatch(r"slow_loader_train\.py\(\d+\): main", top["frame"]), costs
    assert top["share"] > 0.5


def test_without_with_stack_the_trace_has_no_python_frames(job):
    proc, env = job
    done = run_cli("capture", str(proc.pid), "--json", env=env)  # the default
    assert done.returncode == 0, done.stderr
    lines = json.loads(done.stdout)["source_lines"]
    assert lines and all(cost["from"] == "py-spy" for cost in lines)  # the samples' only


def write_trace(path, events) -> str:
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
        for cat, name, ts, dur, tid in events]}))
    return str(path)


def test_self_time_inside_the_dataloader_spans(tmp_path):
    trace = write_trace(tmp_path / "t.json", [
        ("cpu_op", "ProfilerStep#1", 0, 1000, 1),
        ("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         100, 500, 1),
        ("python_function", "train.py(10): main", 0, 1000, 1),
        ("python_function", "ds.py(48): __getitem__", 100, 500, 1),
        ("python_function", "<built-in method tanh of type object>", 200, 300, 1),  # a C call
        ("python_function", "ds.py(60): decode", 300, 100, 1),
        ("python_function", "other.py(1): on_another_thread", 0, 1000, 2),
        # Broken nesting: a child that outlives its parent is cut at the parent's end.
        ("python_function", "train.py(20): log", 800, 100, 1),
        ("python_function", "train.py(21): flush", 850, 500, 1),
    ])
    (dataloader, *_) = top_source_lines(trace)
    assert dataloader.cost == "DataLoader" and dataloader.total_ms == 0.5
    lines = {line.frame: (line.self_ms, line.share) for line in dataloader.lines}
    assert lines == {"ds.py(48): __getitem__": (0.4, 0.8), "ds.py(60): decode": (0.1, 0.2)}
    text = format_source_lines(top_source_lines(trace))
    assert text.splitlines()[1] == "  DataLoader (0.5 ms):"
    assert "80.0 %" in text.splitlines()[2] and "ds.py(48): __getitem__" in text


def waiting_for_workers(tid: int) -> list[tuple]:
    """A step of thread ``tid`` that waits 800 us for a batch of the DataLoader's workers."""
    return [("cpu_op", "ProfilerStep#1", 0, 1000, tid),
            ("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
             100, 800, tid)]


def test_standard_library_and_torch_frames_count_to_the_users_frame_that_called_them(tmp_path):
    trace = write_trace(tmp_path / "t.json", [
        *waiting_for_workers(1),
        ("python_function", "train.py(40): main", 0, 1000, 1),
        ("python_function", "torch/utils/data/dataloader.py(620): __next__", 100, 800, 1),
        ("python_function", "multiprocessing/queues.py(113): get", 150, 700, 1),
        ("python_function", "selectors.py(402): select", 200, 600, 1),
        ("python_function", "ds.py(48): __getitem__", 850, 40, 1),  # the user's, in torch
        # On another thread, no frame of the user's: the innermost library frame is kept.
        *waiting_for_workers(2),
        ("python_function", "threading.py(1000): run", 0, 1000, 2),
        ("python_function", "selectors.py(402): select", 100, 800, 2),
    ])
    (dataloader, *_) = top_source_lines(trace)
    lines = {line.frame: line.self_ms for line in dataloader.lines}
    assert lines == {"train.py(40): main": 0.76, "selectors.py(402): select": 0.8,
                     "ds.py(48): __getitem__": 0.04}


def test_without_python_events_or_readable_trace_there_are_none(tmp_path):
    plain = write_trace(tmp_path / "plain.json", [("cpu_op", "ProfilerStep#1", 0, 10, 1),
                                                   ("cpu_op", "aten::add", 1, 5, 1)])
    assert top_source_lines(plain) == [] and format_source_lines([]) == ""
    (tmp_path / "bad.json").write_text("{not json")
    assert top_source_lines(str(tmp_path / "bad.json")) == []
