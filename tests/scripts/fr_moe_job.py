"""A Megatron-shaped gloo job of 16 ranks (torchrun, CPU) in which chosen ranks fail, each rank
dumping its Flight Recorder every second: the data of tests/data/fr/moe16 (made by
tests/scripts/record_moe_fixtures.py, which runs this file once per scenario).

    torchrun --standalone --nproc-per-node 16 fr_moe_job.py SCENARIO OUT_DIR

Layout, as Megatron lays out tensor (TP=2), context (CP=2), data (DP=4) and expert (EP=4)
parallelism: rank = tp + 2*cp + 4*dp; the expert groups are carved out of the context and data
dimensions, the expert-data-parallel groups are what is left. Every rank creates every group
(new_group's rule), 32 groups beside the world. Each step, interleaved across the groups:
TP _all_gather_base, CP all_reduce, EP all_to_all, TP _reduce_scatter_base, EP all_to_all,
TP all_reduce, EDP all_reduce, DP all_reduce, world all_reduce.

Scenarios (the fault comes at step FAULT_STEP, on the named ranks only):
  sleep    rank 12 sleeps before the expert all_to_all
  sigstop  rank 5 stops itself with SIGSTOP inside a data-parallel all_reduce
  gil      rank 9 spins in pure Python holding the GIL before its _reduce_scatter_base
  two      rank 3 sleeps before the expert all_to_all, rank 14 before the CP all_reduce
  killed   rank 7 is killed (SIGKILL) before the context-parallel all_reduce

Each rank writes OUT_DIR/pickle/nccl_trace_rank_<rank> (the pickle with stacks, as
TORCH_FR_DUMP_TEMP_FILE names it) and OUT_DIR/json/nccl_trace_rank_<rank>.json from a side
thread every DUMP_EVERY_S (a stopped or GIL-holding rank's dumps stop: they come back late), at
once when a collective fails, and OUT_DIR/fault when it injects its fault; OUT_DIR/groups/<rank>.json
holds its groups as NCCL's pg_config states them (gloo leaves that empty).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

SCENARIO, OUT = sys.argv[1], sys.argv[2]
DUMP_EVERY_S = 0.5
COMPUTE_S = 0.4  # a step's forward and backward, between its collectives
FAULT_STEP = 4
STEPS = 6


def write_atomic(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def dump(rank: int) -> None:
    pickled = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True,
                                  onlyActive=False)
    as_json = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    write_atomic(os.path.join(OUT, "pickle", f"nccl_trace_rank_{rank}"), pickled)
    write_atomic(os.path.join(OUT, "json", f"nccl_trace_rank_{rank}.json"), as_json)


failed = threading.Event()


def dumper(rank: int) -> None:
    while True:
        failed.wait(DUMP_EVERY_S)
        dump(rank)
        if failed.is_set():
            return


def layout(world: int) -> dict[str, list[list[int]]]:
    assert world == 16, "the layout is for 16 ranks"
    tp_groups = [[4 * d + 2 * c, 4 * d + 2 * c + 1] for d in range(4) for c in range(2)]
    cp_groups = [[4 * d + t, 4 * d + 2 + t] for d in range(4) for t in range(2)]
    dp_groups = [[t + 2 * c + 4 * d for d in range(4)] for c in range(2) for t in range(2)]
    ep_groups = [[t + 2 * c + 4 * d for d in (2 * j, 2 * j + 1) for c in range(2)]
                 for j in range(2) for t in range(2)]
    edp_groups = [[t + 2 * c + 4 * (2 * j + dd) for j in range(2)]
                  for dd in range(2) for c in range(2) for t in range(2)]
    return {"TENSOR_MODEL_PARALLEL_GROUP": tp_groups, "CONTEXT_PARALLEL_GROUP": cp_groups,
            "DATA_PARALLEL_GROUP": dp_groups, "EXPERT_MODEL_PARALLEL_GROUP": ep_groups,
            "EXPERT_DATA_PARALLEL_GROUP": edp_groups}


def wrap_killed_rank() -> None:
    """The killed rank runs in a child of the process torchrun started, as under a wrapper:
    torchrun would stop every rank at its first look after a worker died."""
    if SCENARIO != "killed" or os.environ.get("RANK") not in {
            str(r) for r, _ in FAULTS["killed"]}:
        return
    if os.fork() == 0:
        return  # the rank itself
    time.sleep(3600)  # the recorder kills the job
    os._exit(0)


# Where each scenario's ranks fail: (rank, the point in the step) -> what they do there.
FAULTS = {
    "sleep": {(12, "ep"): "sleep"},
    "sigstop": {(5, "dp"): "sigstop"},
    "gil": {(9, "rs"): "spin"},
    # Both fail at step FAULT_STEP before either can hold the other up.
    "two": {(3, "ep"): "sleep", (14, "cp"): "sleep"},
    "killed": {(7, "cp"): "kill"},
    "healthy": {},
}


def fault(rank: int, step: int, where: str) -> None:
    """Inject this scenario's fault if it is due here: returns only when none is."""
    what = FAULTS[SCENARIO].get((rank, where)) if step == FAULT_STEP else None
    if what is None:
        return
    write_atomic(os.path.join(OUT, "fault", str(rank)), str(time.time()).encode())
    if what == "sleep":
        time.sleep(3600)  # never reaches the collective that follows
    elif what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif what == "spin":
        sys.setswitchinterval(3600.0)  # no other thread gets the GIL from this loop
        n = 0
        while True:
            n += 1


def step(rank: int, s: int, g: dict, x: torch.Tensor) -> None:
    tp = dist.get_world_size(g["TENSOR_MODEL_PARALLEL_GROUP"])
    ep = dist.get_world_size(g["EXPERT_MODEL_PARALLEL_GROUP"])
    full = torch.empty(x.numel() * tp)
    time.sleep(COMPUTE_S if s else 0.0)
    dist.all_gather_into_tensor(full, x, group=g["TENSOR_MODEL_PARALLEL_GROUP"])
    fault(rank, s, "cp")
    dist.all_reduce(x, group=g["CONTEXT_PARALLEL_GROUP"])
    fault(rank, s, "ep")
    tokens = torch.ones(ep * 16)
    routed = torch.empty_like(tokens)
    dist.all_to_all_single(routed, tokens, group=g["EXPERT_MODEL_PARALLEL_GROUP"])
    fault(rank, s, "rs")
    part = torch.empty(full.numel() // tp)
    dist.reduce_scatter_tensor(part, full, group=g["TENSOR_MODEL_PARALLEL_GROUP"])
    dist.all_to_all_single(tokens, routed, group=g["EXPERT_MODEL_PARALLEL_GROUP"])
    dist.all_reduce(x, group=g["TENSOR_MODEL_PARALLEL_GROUP"])
    dist.all_reduce(x, group=g["EXPERT_DATA_PARALLEL_GROUP"])
    if s == FAULT_STEP and FAULTS[SCENARIO].get((rank, "dp")) == "sigstop":
        write_atomic(os.path.join(OUT, "fault", str(rank)), str(time.time()).encode())
        work = dist.all_reduce(x, group=g["DATA_PARALLEL_GROUP"], async_op=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped inside the collective
        work.wait()
    else:
        dist.all_reduce(x, group=g["DATA_PARALLEL_GROUP"])
    dist.all_reduce(x)


def main() -> None:
    wrap_killed_rank()
    dist.init_process_group("gloo", timeout=timedelta(seconds=900))
    rank, world = dist.get_rank(), dist.get_world_size()
    write_atomic(os.path.join(OUT, "pids", str(rank)), str(os.getpid()).encode())
    mine: dict = {}
    for desc, groups in layout(world).items():
        for ranks in groups:  # every rank creates every group, in the same order
            pg = dist.new_group(ranks, group_desc=desc)
            if rank in ranks:
                mine[desc] = pg
    # The groups as NCCL's pg_config would state them (gloo's is empty): for torchfrtrace in
    # benchmarks/bench_hang_attribution.py, which cannot read a dump without them.
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for desc, pg in mine.items():
        name = dist.distributed_c10d._get_process_group_name(pg)
        config[name] = {"name": name, "desc": desc,
                        "ranks": str(dist.get_process_group_ranks(pg))}
    write_atomic(os.path.join(OUT, "groups", f"{rank}.json"), json.dumps(config).encode())
    x = torch.ones(64)
    step(rank, 0, mine, x)  # a warm-up step, then a first dump: the first one symbolizes its
    dump(rank)  # stacks (seconds per rank); later ones are quick
    dist.barrier()
    threading.Thread(target=dumper, args=(rank,), daemon=True).start()
    try:
        for s in range(1, STEPS + 1):
            step(rank, s, mine, x)
        dist.barrier()
    except Exception as exc:  # a peer died: dump at once, as NCCL does on an error
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        failed.set()
    write_atomic(os.path.join(OUT, "done", str(rank)), b"")
    time.sleep(3600)  # the recorder kills the job


if __name__ == "__main__":
    main()
