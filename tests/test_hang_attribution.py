"""The attribution on jobs of 16 ranks and several process groups, built from a real 4-rank
gloo dump's records (tests/data/fr: its entries' shape, fields and frames), and the NCCL
states gloo never writes (started, completed). Pure Python: no job is run."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from gputop.diagnostics.hang import FrDump, RankStack, StackFrame, attribute, read_dump
from gputop.diagnostics.hang.attribution import IN_FLIGHT_S
from gputop.diagnostics.hang.render import format_report
from tests.conftest import DATA

REAL = read_dump(str(DATA / "fr" / "gloo_multipg_rank_0"))
TEMPLATE = next(e for e in REAL.entries if e.pg_desc == "DATA_PARALLEL_GROUP")
T0 = 1_700_000_000 * 10**9  # ns
WORLD, TP = 16, 4
NOW = T0 / 1e9 + 200.0


def _groups(rank: int) -> list[tuple[str, str, int]]:
    """(pg name, desc, local pg_id) of a rank: TP groups of 4 consecutive ranks, DP groups of
    the ranks equal modulo 4, the world."""
    tp, dp = rank // TP, rank % TP
    return [("0", "default_pg", 0), (str(1 + tp), "TENSOR_PARALLEL_GROUP", 1),
            (str(1 + WORLD // TP + dp), "DATA_PARALLEL_GROUP", 2)]


def _entry(pg: tuple[str, str, int], seq: int, done: bool, op: str = "gloo:all_reduce",
           t: float = 0.0, state: str = "scheduled", sizes=None):
    return replace(TEMPLATE, pg_id=pg[0], pg_desc=pg[1], pg_index=pg[2], seq=seq, op=op,
                   retired=done, state=state, time_created_ns=T0 + int(t * 1e9),
                   input_sizes=TEMPLATE.input_sizes if sizes is None else sizes)


def _job(stop_rank: int | None, stop_at: int, steps: int = 42) -> dict[int, FrDump]:
    """Each step: TP all_reduce, DP all_reduce, world all_reduce. ``stop_rank`` stops after its
    TP all_reduce of step ``stop_at`` (never reaches the DP one); with None every rank waits in
    the world's all_reduce of that step."""
    dumps = {}
    stopped_dp = None if stop_rank is None else _groups(stop_rank)[2][0]
    for r in range(WORLD):
        world, tp, dp = _groups(r)
        entries = []
        for s in range(1, steps + 1):
            t = s * 1.0
            entries.append(_entry(tp, s, True, t=t))
            if r == stop_rank and s == stop_at:
                break
            blocked = dp[0] == stopped_dp and s == stop_at
            entries.append(_entry(dp, s, not blocked, t=t + 0.1))
            if blocked:
                break
            last = s == stop_at
            entries.append(_entry(world, s, not last, t=t + 0.2))
            if last:
                break
        dumps[r] = replace(REAL, name=f"nccl_trace_rank_{r}", rank=r, entries=tuple(entries),
                           pg_status={}, pg_config={}, dumped_at=NOW)
    return dumps


def test_sixteen_ranks_three_kinds_of_group_name_the_rank_and_its_group():
    report = attribute(_job(stop_rank=11, stop_at=42))
    assert report.verdict == "hang"
    f = report.findings[0]
    assert f.id == "hang"
    assert f.ranks == (11,)
    # Every other rank waits: its data-parallel peers in #42 there, the rest in the world's.
    assert f.waiting_ranks == tuple(r for r in range(WORLD) if r != 11)
    assert f.process_group == {"id": str(1 + WORLD // TP + 3), "desc": "DATA_PARALLEL_GROUP"}
    assert f.seq == 42 and f.collective == "gloo:all_reduce"
    assert f.since_s == pytest.approx(200.0 - 42.1, abs=0.01) == f.waited_s
    # One finding: the world's wait is a symptom of it, not a second cause.
    assert len(report.findings) == 1
    world = next(x for x in f.symptoms if x["process_group"]["desc"] == "default_pg")
    assert world["because_of"] == [3, 7, 11, 15] and len(world["waiting_ranks"]) == 12
    assert [c["rank"] for c in f.culprits] == [11] and f.culprits[0]["how"] == "never-entered"
    text = " ".join(format_report(report).split())
    assert "rank 11 never reached all_reduce #42 of DATA_PARALLEL_GROUP; 15 other ranks in 2 " \
        "groups wait because of it (158 s)" in text


def test_a_collective_in_flight_when_the_ranks_were_read_is_not_a_hang():
    """Live records are read rank by rank: a rank read before its peers entered the collective
    is not behind, and a wait under IN_FLIGHT_S when read is a collective in progress. The same
    records read later (the wait long, every rank read after it began) name rank 11."""
    began = T0 / 1e9 + 42.1  # the DP all_reduce #42 rank 11's peers wait in
    early = _job(stop_rank=11, stop_at=42)
    early[11] = replace(early[11], dumped_at=began - 0.3)
    report = attribute(early, now=NOW)
    assert not any(f.id == "hang" and f.seq == 42 and 11 in f.ranks and f.waiting_ranks ==
                   (3, 7, 15) for f in report.findings), report.findings
    assert "rank 11 was read before the others entered it" in told(report), report
    short = {r: replace(d, dumped_at=began + 0.5) for r, d in
             _job(stop_rank=11, stop_at=42).items()}
    report = attribute(short, now=began + 0.5)
    dp = [f for f in report.findings if f.process_group["desc"] == "DATA_PARALLEL_GROUP"]
    assert dp == [] and report.verdict == "healthy" and "in flight (0.50 s" in told(report)
    # Rank 11's process is gone (a live collection knows): the job's collectives cannot all
    # complete, however short the others' wait so far.
    gone = attribute({r: d for r, d in short.items() if r != 11}, now=began + 0.5, gone={11})
    assert gone.verdict == "hang" and "in flight" not in told(gone), gone
    late = {r: replace(d, dumped_at=began + IN_FLIGHT_S + 0.5) for r, d in
            _job(stop_rank=11, stop_at=42).items()}
    report = attribute(late, now=began + IN_FLIGHT_S + 0.5)
    assert report.findings[0].ranks == (11,) and 11 not in report.findings[0].waiting_ranks


def told(report) -> str:
    """What a report says beside its findings: its notes and why it is healthy."""
    return " ".join((*report.notes, report.healthy_reason or ""))


def test_a_live_stack_gives_the_named_rank_its_line():
    stacks = {11: RankStack(rank=11, pid=4242, frames=(
        StackFrame("sleep", "<built-in>"),
        StackFrame("train_step", "/home/u/train.py", 57),
        StackFrame("<module>", "/home/u/train.py", 90)), holds_gil=False)}
    report = attribute(_job(stop_rank=11, stop_at=42), stacks=stacks)
    lines = dict(report.findings[0].rank_lines)
    assert lines[11] == "train.py:57 sleep"
    assert "rank 11 is at train.py:57 sleep" in report.findings[0].evidence
    spinning = RankStack(rank=11, where="train.py:31 spin", holds_gil=True)
    report = attribute(_job(stop_rank=11, stop_at=42), stacks={11: spinning})
    assert dict(report.findings[0].rank_lines)[11] == "train.py:31 spin (holds the GIL)"


def test_a_desync_at_sixteen_ranks_names_the_minority_and_both_calls():
    dumps = _job(stop_rank=None, stop_at=10, steps=10)  # nobody stops: every rank waits in #10
    world_10 = ("0", "default_pg", 0)
    for r in (5, 6):
        entries = list(dumps[r].entries)
        entries[-1] = _entry(world_10, 10, False, t=10.2, sizes=((4096,),))
        dumps[r] = replace(dumps[r], entries=tuple(entries))
    report = attribute(dumps)
    assert report.verdict == "desync"
    f = report.findings[0]
    assert f.ranks == (5, 6) and f.seq == 10
    assert len(f.waiting_ranks) == 14
    assert {c["call"] for c in f.calls} == {"gloo:all_reduce [[1024]] Float",
                                            "gloo:all_reduce [[4096]] Float"}


def test_a_missing_rank_named_by_the_group_config_is_the_cause():
    dumps = _job(stop_rank=None, stop_at=5, steps=5)
    del dumps[15]
    dumps[0] = replace(dumps[0], pg_config={"0": {"desc": "default_pg",
                                                  "ranks": list(range(WORLD))}})
    report = attribute(dumps)
    assert report.missing_ranks == (15,)
    f = report.findings[0]
    assert f.id == "hang" and 15 in f.ranks and f.no_dump == (15,)


def test_nccl_states_a_rank_whose_gpu_never_started_the_collective():
    # NCCL writes started/completed: ranks 0-2 started all_reduce #7, rank 3 only enqueued it.
    pg = ("0", "default_pg", 0)
    dumps = {}
    for r in range(4):
        entries = [_entry(pg, s, True, op="nccl:all_reduce", state="completed", t=s)
                   for s in range(1, 7)]
        entries.append(_entry(pg, 7, False, op="nccl:all_reduce", t=7,
                              state="scheduled" if r == 3 else "started"))
        dumps[r] = replace(REAL, name=f"r{r}", rank=r, entries=tuple(entries), pg_status={},
                           pg_config={}, dumped_at=NOW)
    report = attribute(dumps)
    assert report.verdict == "stuck-collective"
    f = report.findings[0]
    assert f.ranks == (3,) and f.collective == "nccl:all_reduce" and f.seq == 7
    assert "never started it" in f.title


def test_every_rank_done_is_healthy_and_no_records_says_how_to_turn_it_on():
    dumps = _job(stop_rank=None, stop_at=99, steps=3)
    assert attribute(dumps).verdict == "healthy"
    empty = {0: replace(REAL, entries=(), pg_status={}, pg_config={})}
    report = attribute(empty)
    assert report.verdict == "no-records"
    assert "TORCH_FR_BUFFER_SIZE" in report.notes[-1]


def test_control_characters_from_a_dump_are_escaped_in_the_text():
    dumps = _job(stop_rank=2, stop_at=3, steps=3)
    dumps = {r: replace(d, entries=tuple(replace(e, pg_desc="EVIL\x1b[31m") for e in d.entries))
             for r, d in dumps.items()}
    text = format_report(attribute(dumps))
    assert "\x1b" not in text and "\\x1b" in text


# -- real NCCL dumps (benchmarks/gpu/fr_nccl_dump.py on an H200, torch 2.11, NCCL 2.28.9) -----

NCCL = DATA / "fr"


@pytest.mark.parametrize("name", ["nccl_trace_rank_0", "nccl_trace_rank_0.json"])
def test_a_real_nccl_dump_reads_with_its_states_groups_and_version(name):
    d = read_dump(str(NCCL / "nccl_h200_inflight" / name))
    assert d.rank == 0 and d.comm_lib_version == "2.28.9"
    assert d.pg_config["1"] == {"desc": "DATA_PARALLEL_GROUP", "ranks": [0]}
    ops = {e.op for e in d.entries}
    assert {"nccl:all_reduce", "nccl:broadcast", "nccl:_all_gather_base"} <= ops
    assert all(e.state == "completed" for e in d.entries[:-1])
    last = d.entries[-1]
    assert (last.op, last.seq, last.state, last.completed) == ("nccl:all_reduce", 33,
                                                               "scheduled", False)
    assert d.pg_status["0"] == {"enqueued": 33, "started": 32, "completed": 32}


def test_a_real_nccl_dump_in_flight_and_done():
    report = attribute({0: read_dump(str(NCCL / "nccl_h200_inflight" / "nccl_trace_rank_0"))})
    f = report.findings[0]
    assert report.verdict == "stuck-collective"
    assert (f.collective, f.seq, f.state, f.process_group) == (
        "nccl:all_reduce", 33, "scheduled", {"id": "0", "desc": "default_pg"})
    report = attribute({0: read_dump(str(NCCL / "nccl_h200_done" / "nccl_trace_rank_0"))})
    assert report.verdict == "healthy"


def test_a_dump_named_without_a_rank_gets_it_from_its_groups():
    # NCCL's pg_config lists each group's global ranks: rank 6's TP and DP groups meet in it.
    from gputop.diagnostics.hang import read_dump_bytes

    raw = pickle.loads((DATA / "fr" / "gloo_multipg_rank_0").read_bytes())  # our own data
    raw["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(16)))},
                        "2": {"name": "2", "desc": "TENSOR_PARALLEL_GROUP", "ranks": "[4, 5, 6, 7]"},
                        "7": {"name": "7", "desc": "DATA_PARALLEL_GROUP", "ranks": "[2, 6, 10, 14]"}}
    assert read_dump_bytes(pickle.dumps(raw), "dump.pkl").rank == 6
    raw["pg_config"] = {}
    assert read_dump_bytes(pickle.dumps(raw), "dump.pkl").rank is None
