"""Compiled CPU jobs that write torch.compile's structured logs (TORCH_TRACE): the test data of
tests/test_compile_log.py (tests/data/compile_logs/, gzipped).

    TORCH_TRACE=OUT_DIR python compile_log_job.py MODE

Modes:
  break    a model with `.item()` in forward (a graph break at its line) called with batch sizes
           4, 5, 4 (recompiles: size of `x` dim 0 changed)
  limit    the same with torch._dynamo.config.recompile_limit = 1: the second size falls back
           to eager
  shapes   4 gloo ranks (torch.multiprocessing); ranks 1 and 3 see batch sizes 8, 9, 10 and
           recompile, ranks 0 and 2 see 8 every time; the all_reduce is of a fixed size
  desync   4 gloo ranks; rank 3's compiled step calls one all_reduce more than the others (the
           job fails once the graphs run: the log is written before)

Re-record: for m in break limit shapes desync; do rm -rf /tmp/cl/$m; TORCH_TRACE=/tmp/cl/$m
python tests/scripts/compile_log_job.py $m; gzip -9 /tmp/cl/$m/*.log; done, then copy
/tmp/cl/* to tests/data/compile_logs/ (backend aot_eager: no C++ compiler needed, the logs
carry the same dynamo records as inductor's).
"""

from __future__ import annotations

import datetime
import os
import sys

import torch

BACKEND = os.environ.get("COMPILE_LOG_BACKEND", "aot_eager")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        scale = y.abs().mean().item()  # a graph break: a Python float from a tensor
        return y / (scale + 1.0)


def single(mode: str) -> None:
    if mode == "limit":
        torch._dynamo.config.recompile_limit = 1
    model = torch.compile(Net(), backend=BACKEND, dynamic=False)
    for batch in (4, 5, 4):
        model(torch.randn(batch, 8))


def rank_main(rank: int, world: int, mode: str, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))

    def step(x: torch.Tensor) -> torch.Tensor:
        s = (x * 2).sum(0)  # of a fixed size whatever the batch
        if mode == "desync" and rank == world - 1:
            dist.all_reduce(s * 1)  # one collective more on one rank
        dist.all_reduce(s)
        return s

    fn = torch.compile(step, backend=BACKEND, dynamic=False)
    try:
        for i in range(3):
            batch = 8 + i if (mode == "shapes" and rank in (1, 3)) else 8
            fn(torch.ones(batch, 4))
    except RuntimeError:
        if mode != "desync":
            raise
    finally:
        dist.destroy_process_group()


def main() -> None:
    mode = sys.argv[1]
    if mode in ("break", "limit"):
        single(mode)
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(4, mode, port), nprocs=4, join=mode != "desync")


if __name__ == "__main__":
    main()
