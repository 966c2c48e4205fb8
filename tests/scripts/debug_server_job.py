"""A 4-rank gloo job (torchrun, CPU) that runs PyTorch's Debug Server with periodic dumps into
OUT_DIR, and whose rank 2 sleeps before an all_reduce: the others wait in it.

    torchrun --standalone --nproc-per-node 4 debug_server_job.py OUT_DIR PORT

The servers bind 127.0.0.1 only (PyTorch binds every interface: patched here, for a test
host). Needs aiohttp, jinja2 and tabulate (the test extra).
"""

from __future__ import annotations

import socket
import sys
import time
import types

import torch
import torch.distributed as dist
import torch.distributed.debug as debug
import torch.distributed.debug._frontend as frontend

OUT, PORT = sys.argv[1], int(sys.argv[2])


class _LocalServer(frontend._IPv6HTTPServer):
    address_family = socket.AF_INET

    def __init__(self, address, handler):  # noqa: ANN001
        super().__init__(("127.0.0.1", address[1]), handler)


def local_only() -> None:
    worker = debug._WorkerServer
    debug._WorkerServer = lambda host, port: worker("127.0.0.1", port)
    debug.socket = types.SimpleNamespace(gethostname=lambda: "127.0.0.1")
    frontend._IPv6HTTPServer = _LocalServer


def main() -> None:
    dist.init_process_group("gloo")
    local_only()
    debug.start_debug_server(port=PORT, dump_dir=OUT, dump_interval=1.0,
                             enabled_dumps={"stacks", "fr_trace"}, fetch_timeout=5.0)
    rank = dist.get_rank()
    x = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(x)
    if rank == 2:
        time.sleep(3600)  # the hang: rank 2 never reaches the all_reduce below
    dist.all_reduce(x)
    time.sleep(3600)


if __name__ == "__main__":
    main()
