"""A real NCCL Flight Recorder dump, pickle and JSON, from a 1-rank job on one GPU.

    python benchmarks/gpu/fr_nccl_dump.py --out "$OUT"            # on a GPU, < 60 s
    python benchmarks/gpu/fr_nccl_dump.py --backend gloo --out /tmp/fr   # dry run on CPU

Brings back the dump format NCCL writes (states started/completed, timing, pg_config with
each group's ranks, the NCCL version), which CPU tests (gloo) cannot make, so that
gputop/diagnostics/hang/dumps.py can be checked on it: `gputop analyze OUT/done` and
`gputop analyze OUT/inflight`.

Writes, under OUT:
* ``done/nccl_trace_rank_0`` and ``done/nccl_trace_rank_0.json``: after a few steps of
  all_reduce, all_gather, reduce_scatter, broadcast (world) and all_reduce (a
  DATA_PARALLEL_GROUP subgroup), every collective completed;
* ``inflight/nccl_trace_rank_0`` and ``.json`` (NCCL only): dumped while an all_reduce waits
  behind a long GPU kernel (``torch.cuda._sleep``), so its entry is not completed;
* ``summary.json``: versions, entry counts and states per dump, the time each dump took.

World size 1: NCCL refuses two ranks on one GPU, and one rank is enough for the format.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "fr_out",
                    help="folder for the dumps (default $OUT, else ./fr_out)")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    # Before torch.distributed starts: the buffer, NCCL's timing (the "started" state), and
    # the file NCCL's watchdog would dump to on a timeout.
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE",
                          os.path.join(os.path.abspath(args.out), "watchdog", "nccl_trace_rank_"))
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    nccl = args.backend == "nccl"
    if nccl and not torch.cuda.is_available():
        print("fr_nccl_dump: no CUDA device: use --backend gloo for a dry run", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if nccl else torch.device("cpu")
    if nccl:
        torch.cuda.set_device(device)
    store = tempfile.NamedTemporaryFile(prefix="fr_store_", delete=False).name
    os.unlink(store)
    dist.init_process_group(args.backend, init_method=f"file://{store}", rank=0, world_size=1,
                            **({"device_id": device} if nccl else {}))
    dp = dist.new_group([0], group_desc="DATA_PARALLEL_GROUP")
    summary: dict = {"torch": torch.__version__, "backend": args.backend,
                     "nccl": ".".join(map(str, torch.cuda.nccl.version())) if nccl else None,
                     "device": torch.cuda.get_device_name(0) if nccl else "cpu", "dumps": {}}

    # NCCL keeps its own recorder: _dump_fr_trace (the CPU/gloo one) has no NCCL entries
    # (torch 2.11 on an H200: 0 entries; _dump_nccl_trace: all 40).
    dump_pickle = c10d._dump_nccl_trace if nccl else c10d._dump_fr_trace
    dump_json = c10d._dump_nccl_trace_json if nccl else c10d._dump_fr_trace_json

    def dump(phase: str) -> None:
        folder = os.path.join(args.out, phase)
        os.makedirs(folder, exist_ok=True)
        t0 = time.perf_counter()
        raw = dump_pickle(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        t1 = time.perf_counter()
        js = dump_json(includeCollectives=True, onlyActive=False)
        t2 = time.perf_counter()
        with open(os.path.join(folder, "nccl_trace_rank_0"), "wb") as fh:
            fh.write(raw)
        with open(os.path.join(folder, "nccl_trace_rank_0.json"), "wb") as fh:
            fh.write(js if isinstance(js, bytes) else js.encode())
        d = pickle.loads(raw)  # our own process's dump: trusted here
        states: dict[str, int] = {}
        for e in d.get("entries", []):
            key = f"{e.get('profiling_name')}:{e.get('state')}:retired={e.get('retired')}"
            states[key] = states.get(key, 0) + 1
        summary["dumps"][phase] = {
            "pickle_bytes": len(raw), "json_bytes": len(js), "pickle_s": round(t1 - t0, 3),
            "json_s": round(t2 - t1, 3), "version": d.get("version"),
            "keys": sorted(d), "pg_config": d.get("pg_config"), "pg_status": d.get("pg_status"),
            "entries": len(d.get("entries", [])), "states": states}

    x = torch.ones(1 << 20, device=device)
    out = torch.empty(1 << 20, device=device)
    for _ in range(args.steps):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out, x)
        dist.reduce_scatter_tensor(x, out)
        dist.broadcast(x, 0)
        dist.all_reduce(x, group=dp)
    if nccl:
        torch.cuda.synchronize()
    time.sleep(0.5)  # the watchdog marks the last works completed
    dump("done")
    if nccl:
        # An all_reduce queued behind a ~2 s kernel: dumped before it can start.
        torch.cuda._sleep(int(2e9))
        work = dist.all_reduce(x, async_op=True)
        dump("inflight")
        work.wait()
        torch.cuda.synchronize()
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1, default=str)
    print(json.dumps(summary, default=str)[:4000], flush=True)
    # No destroy_process_group(): with a file store it can wait on the store for long; the
    # dumps are written, nothing else is owed.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
