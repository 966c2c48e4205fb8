"""The live half of issue 36 in pieces: the hang rule on snapshots as the agents report them,
its bound and its documented floor, the agent's bounded fr_dump reply, and `gputop run`
turning Flight Recorder on. (Whole jobs: tests/test_hang_live.py.)"""

from __future__ import annotations

import os
import time

import pytest

from gputop.agent import flight_recorder
from gputop.commands.run import job_environment
from gputop.core.agent_status import parse_status
from gputop.core.model import DriverInfo, HostSample, ProcSample, Snapshot
from gputop.core.protocol import MAX_MESSAGE, encode
from gputop.diagnostics.live import evaluate
from gputop.diagnostics.live.hang import MIN_ENV, bound_s, min_bound_s

JOB = "torchrun:unit"


def rank(pid: int, r: int, age: float, p95: float = 0.05, ckpt: float | None = None,
         cpu: float = 1.0) -> ProcSample:
    agent = {"rank": r, "local_rank": r, "world_size": 4, "local_world_size": 4, "job_id": JOB,
             "steps": 100, "steps_per_s": 10.0, "step_time_p50_s": p95 / 2,
             "step_time_p95_s": p95, "last_step_age_s": age, "checkpoint_s": ckpt}
    return ProcSample(pid=pid, name="python", cpu_percent=cpu, ppid=os.getpid(),
                      agent=parse_status(agent))


def history(ranks_at, seconds: int = 8) -> list[Snapshot]:
    """Snapshots 1 s apart, now; ``ranks_at(t)`` gives each one's processes."""
    now = time.time()
    return [Snapshot(now - seconds + t, HostSample("node"), DriverInfo(False),
                     other_processes=tuple(ranks_at(t))) for t in range(seconds + 1)]


def ids(findings) -> set[str]:
    return {f.id for f in findings}


@pytest.fixture
def floor(monkeypatch):
    monkeypatch.setenv(MIN_ENV, "5")


def test_bound_is_ten_p95_with_a_floor_that_only_the_documented_variable_moves(monkeypatch):
    monkeypatch.delenv(MIN_ENV, raising=False)
    assert min_bound_s() == 60.0 and bound_s([0.5]) == 60.0 and bound_s([9.0, 2.0]) == 90.0
    monkeypatch.setenv(MIN_ENV, "5")
    assert bound_s([0.1]) == 5.0
    for bad in ("", "-3", "nan", "abc", "1e99"):
        monkeypatch.setenv(MIN_ENV, bad)
        assert min_bound_s() == 60.0, bad


def test_ranks_that_stopped_stepping_past_the_bound_hang(floor):
    found = evaluate(history(lambda t: [rank(100 + r, r, age=3.0 + t) for r in range(4)]))
    hang = [f for f in found if f.id == "hang"]
    assert hang and hang[0].job == JOB and "bound" in hang[0].evidence, found
    assert "gputop hang" in hang[0].next_step


def test_a_slow_step_is_not_a_hang(floor):
    # The job's steps take 2 s at p95: 6 s without a step is within its own 10 x p95.
    found = evaluate(history(lambda t: [rank(100 + r, r, age=6.0, p95=2.0) for r in range(4)]))
    assert "hang" not in ids(found)
    # And steps that keep ending never hang.
    found = evaluate(history(lambda t: [rank(100 + r, r, age=0.05) for r in range(4)]))
    assert "hang" not in ids(found)


def test_a_job_wide_checkpoint_is_not_a_hang(floor):
    found = evaluate(history(lambda t: [rank(100 + r, r, age=10.0 + t, ckpt=9.0 + t)
                                        for r in range(4)]))
    assert not ids(found) & {"hang", "rank-exited"}, found


def test_a_rank_gone_from_a_live_job_is_rank_exited(floor):
    # Rank 3 was seen, then its process is gone (a pid that cannot exist).
    def procs(t):
        out = [rank(100 + r, r, age=3.0 + t) for r in range(3)]
        return out + ([rank(999_999_999, 3, age=3.0 + t)] if t < 2 else [])

    found = evaluate(history(procs))
    exited = [f for f in found if f.id == "rank-exited"]
    assert exited and exited[0].rank == 3 and "999999999" in exited[0].title, found


def test_fr_dump_reply_keeps_the_newest_entries_within_one_message():
    entries = [{"collective_seq_id": i, "profiling_name": "nccl:all_reduce", "frames":
                [{"name": "f", "filename": "x.py", "line": 1}] * 20, "pad": "x" * 300}
               for i in range(2000)]
    reply = flight_recorder.fit_reply({"version": "2.10", "entries": entries,
                                       "pg_config": {}}, {"ok": True, "rank": 0})
    assert len(encode(reply)) <= MAX_MESSAGE
    kept = reply["dump"]["entries"]
    assert kept and kept[-1]["collective_seq_id"] == 1999 and "frames" not in kept[0]
    assert reply["entries_dropped"] == 2000 - len(kept) and reply["entries_total"] == 2000


def test_fr_status_and_request_without_flight_recorder(monkeypatch):
    for name in flight_recorder.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    assert flight_recorder.status()["enabled"] is False
    assert "TORCH_FR_BUFFER_SIZE" in flight_recorder.status()["hint"]
    reply = flight_recorder.request({"cmd": "fr_dump"}, 0)
    assert reply["ok"] is False and reply["error"] == "fr-off"
    assert flight_recorder.request({"cmd": "fr_dump", "x": 1}, 0)["error"] == "bad-request"
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")
    assert flight_recorder.status() == {"enabled": True, "buffer": 500,
                                        "env": "TORCH_NCCL_TRACE_BUFFER_SIZE"}


def test_gputop_run_turns_flight_recorder_on_unless_the_job_set_it():
    assert job_environment({})["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert job_environment({"TORCH_FR_BUFFER_SIZE": "0"})["TORCH_FR_BUFFER_SIZE"] == "0"
    env = job_environment({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"})
    assert "TORCH_FR_BUFFER_SIZE" not in env and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "100"
