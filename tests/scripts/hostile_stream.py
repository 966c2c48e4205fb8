"""A hostile "node": what a compromised or broken node could send to `gputop --hosts` in place
of `gputop stream`. Run by the test nodes' wrapper (over real sshd) as
``hostile_stream.py KIND``:

* ``escapes``: a valid stream whose GPU name, process command, user and finding text carry
  terminal escapes, C1 controls and bidi overrides;
* ``long-line``: a hello, then 2 MiB without a newline;
* ``flood``: a hello, then a sample with 100 GPUs;
* ``garbage``: a hello, then a line that is not JSON;
* ``silent``: a hello, then nothing (a hung node).
"""

from __future__ import annotations

import json
import sys
import time

EVIL = "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eevil"


def hello() -> None:
    print(json.dumps({"type": "hello", "schema": 1, "version": "9.9", "hostname": "evil" + EVIL,
                      "interval": 0.5, "demo": None}), flush=True)


def sample(gpus: int = 1) -> str:
    proc = {"pid": 4242, "name": "train" + EVIL, "cmdline": "python " + EVIL, "user": EVIL,
            "state": "running", "visible": True, "gpu_mem": 1 << 30, "workers": []}
    return json.dumps({
        "type": "sample", "time": time.time(),
        "snapshot": {
            "time": time.time(),
            "host": {"hostname": "evil" + EVIL, "cpu_percent": 12.0},
            "driver": {"available": True, "driver_version": "570" + EVIL, "cuda_version": "12.8"},
            "gpus": [{"index": i, "name": "GPU" + EVIL, "uuid": "GPU-" + EVIL, "util_gpu": 10.0,
                      "mem_used": 1 << 30, "mem_total": 80 << 30, "processes": [proc]}
                     for i in range(gpus)],
            "processes": [],
        },
        "findings": [{"id": "dataloader-stall", "severity": "critical",
                      "title": "starved" + EVIL, "evidence": EVIL, "fix": EVIL,
                      "next_step": EVIL, "cost_s": 8.0, "gpu": 0, "pid": 4242}],
    })


def main() -> None:
    kind = sys.argv[1]
    hello()
    if kind == "escapes":
        while True:
            print(sample(), flush=True)
            time.sleep(0.5)
    elif kind == "long-line":
        sys.stdout.write("x" * (2 << 20))
        sys.stdout.flush()
        time.sleep(600)
    elif kind == "flood":
        print(sample(gpus=100), flush=True)
        time.sleep(600)
    elif kind == "garbage":
        print("{this is not json", flush=True)
        time.sleep(600)
    elif kind == "silent":
        time.sleep(600)


if __name__ == "__main__":
    main()
