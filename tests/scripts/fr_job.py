"""A 4-rank gloo job (torchrun) in which chosen ranks fail, each rank dumping its own Flight
Recorder buffer: the test data of tests/test_hang_dumps.py.

    torchrun --standalone --nproc-per-node 4 fr_job.py SCENARIO OUT_DIR

Scenarios: sleep (rank 2 sleeps before an all_reduce), desync (rank 0 calls all_gather where
the others call all_reduce), killed (rank 3 is killed mid-run: SIGKILL), multipg (two tensor- and two
data-parallel subgroups beside the world; rank 3 sleeps before a data-parallel all_reduce),
healthy (every rank finishes). Each rank writes OUT_DIR/pickle/fr_trace_rank_<rank> (the
pickle, as TORCH_FR_DUMP_TEMP_FILE would name it) and OUT_DIR/json/fr_trace_rank_<rank>.json,
a few seconds after it reached the scenario's point (at once when a collective failed: torchrun
stops every rank soon after one died), from a side thread (the main thread may be blocked in a
collective), then exits once every live rank has dumped.
"""

from __future__ import annotations

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
DUMP_AFTER_S = float(os.environ.get("FR_JOB_DUMP_AFTER_S", "3"))
STEPS = 5  # collectives before the scenario's point


def write_atomic(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def dump(rank: int) -> None:
    write_atomic(os.path.join(OUT, "pickle", f"fr_trace_rank_{rank}"),
                 c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True,
                                     onlyActive=False))
    write_atomic(os.path.join(OUT, "json", f"fr_trace_rank_{rank}.json"),
                 c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))


reached = threading.Event()
failed = threading.Event()  # a collective raised (a peer died): dump at once


def dumper(rank: int, alive: list[int]) -> None:
    reached.wait()
    failed.wait(DUMP_AFTER_S)
    dump(rank)
    # Exit only once every live rank has dumped: a rank that exits closes its connections, and
    # a peer waiting in a collective would fail before its own dump.
    write_atomic(os.path.join(OUT, "done", str(rank)), b"")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(OUT, "done", str(r))) for r in alive):
        time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)


def wrap_killed_rank() -> None:
    """Rank 3 of the killed job runs in a child of the process torchrun started, as under a
    wrapper: torchrun stops every rank at its first look after a worker died, which would race
    the survivors' dumps; the wrapper outlives the killed rank until they have dumped."""
    if SCENARIO != "killed" or os.environ.get("RANK") != "3":
        return
    child = os.fork()
    if child == 0:
        return  # the rank itself
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(OUT, "done", str(r))) for r in (0, 1, 2)):
        time.sleep(0.05)
    os.waitpid(child, 0)
    os._exit(0)


def main() -> None:
    wrap_killed_rank()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    alive = [r for r in range(world) if not (SCENARIO == "killed" and r == 3)]
    threading.Thread(target=dumper, args=(rank, alive), daemon=True).start()
    t = torch.ones(1024)
    groups = {}
    if SCENARIO == "multipg":
        # Every rank creates every group (new_group's rule), in the same order.
        for ranks in ([0, 1], [2, 3]):
            g = dist.new_group(ranks, group_desc="TENSOR_PARALLEL_GROUP")
            if rank in ranks:
                groups["tp"] = g
        for ranks in ([0, 2], [1, 3]):
            g = dist.new_group(ranks, group_desc="DATA_PARALLEL_GROUP")
            if rank in ranks:
                groups["dp"] = g
    for _ in range(STEPS):
        dist.all_reduce(t)
        if groups:
            dist.all_reduce(t, group=groups["tp"])
            dist.all_reduce(t, group=groups["dp"])
    reached.set()
    try:
        scenario(rank, world, t, groups)
    except Exception as exc:  # e.g. gloo: a peer closed its connection; wait to be dumped
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        failed.set()
    time.sleep(3600)  # the dumper thread ends the process


def scenario(rank: int, world: int, t: torch.Tensor, groups: dict) -> None:
    if SCENARIO == "sleep":
        if rank == 2:
            time.sleep(3600)  # the hang: rank 2 never reaches the all_reduce below
        dist.all_reduce(t)
    elif SCENARIO == "desync":
        if rank == 0:
            dist.all_gather([torch.empty_like(t) for _ in range(world)], t)
        else:
            dist.all_reduce(t)
    elif SCENARIO == "killed":
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
    elif SCENARIO == "multipg":
        dist.all_reduce(t, group=groups["tp"])
        if rank == 3:
            time.sleep(3600)  # rank 3 never reaches the data-parallel all_reduce
        dist.all_reduce(t, group=groups["dp"])
        dist.all_reduce(t)
    elif SCENARIO == "healthy":
        dist.all_reduce(t)
        dist.barrier()


if __name__ == "__main__":
    main()
