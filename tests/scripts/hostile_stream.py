"""A hostile "node": what a compromised or broken node could send to `gputop --hosts` in place
of `gputop stream`. Run by the test nodes' wrapper (over real sshd) as
``hostile_stream.py KIND``:

* ``escapes``: a valid stream whose GPU name, process command, user and finding text carry
  terminal escapes, C1 controls and bidi overrides;
* ``long-line``: a hello, then 2 MiB without a newline;
* ``flood``: a hello, then a sample with 100 GPUs;
* ``garbage``: a hello, then a line that is not JSON;
* ``silent``: a hello, then nothing (a hung node);
* ``forged-short``: a valid stream with ``FORGE_CTRL`` (a forged alert line between JSON's
  short escapes \\r \\n \\b \\f \\t, and nothing else to escape) in every string field of
  the hello, the snapshot and the findings;
* ``forged``: the same with ``FORGE`` (those, C1 controls and bidi overrides), sent as JSON
  escapes and as raw UTF-8 in turn.
"""

from __future__ import annotations

import json
import sys
import time

EVIL = "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eevil"
# Text that, printed raw, would add a forged alert line to `watch`'s output.
FORGE_CTRL = "\r\n12:00:00 node-x: RAISED   critical forged-alert GPU 0: forged\b\f\tend"
FORGE = FORGE_CTRL + "\x85\x9b31m\u202e\u2066\u200fend"


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


def forged_lines(forge: str, ascii_only: bool) -> tuple[str, str]:
    """The hello and a sample line with ``forge`` in every string field of the schema: the
    model's own dataclasses are walked, so a string field added later is covered too."""
    import dataclasses

    from gputop.core.agent_status import AgentStatus
    from gputop.core.model import (
        DriverInfo,
        GpuSample,
        HostSample,
        ProcSample,
        Snapshot,
        WorkerSample,
    )
    from gputop.core.snapshot_json import snapshot_to_json

    def filled(cls, **given):
        values = {}
        for f in dataclasses.fields(cls):
            kind = str(f.type)
            if f.name in given:
                values[f.name] = given[f.name]
            elif kind.startswith("tuple[str"):
                values[f.name] = (forge,)
            elif kind.startswith("str"):
                values[f.name] = forge
        return cls(**values)

    worker = filled(WorkerSample, pid=4243, cpu_percent=80.0, rss=1 << 20)
    agent = {"job_id": forge, "rank": 0, "world_size": 1, "steps": 10, "message": forge,
             forge: forge}
    agent = AgentStatus(agent)  # unchecked: a hostile node sends what it likes
    proc = filled(ProcSample, pid=4242, gpu_mem=1 << 30, workers=(worker,), agent=agent)
    gpu = filled(GpuSample, index=0, util_gpu=10.0, mem_used=1 << 30, mem_total=80 << 30,
                 processes=(proc,))
    snap = Snapshot(time=time.time(), host=filled(HostSample), driver=filled(
        DriverInfo, available=True), gpus=(gpu,), other_processes=(
        filled(ProcSample, pid=4244, workers=(worker,), agent=agent),))
    finding = {"id": "dataloader-stall", "severity": "critical", "title": forge,
               "evidence": forge, "fix": forge, "next_step": forge, "cost_s": 8.0, "gpu": 0,
               "pid": 4242}
    hello_line = json.dumps({"type": "hello", "schema": 1, "version": forge[-60:],
                             "hostname": forge, "interval": 0.5, "demo": forge[-60:]},
                            ensure_ascii=ascii_only)
    sample_line = json.dumps({"type": "sample", "time": time.time(),
                              "snapshot": snapshot_to_json(snap), "findings": [finding]},
                             ensure_ascii=ascii_only)
    return hello_line, sample_line


def main() -> None:
    kind = sys.argv[1]
    if kind.startswith("forged"):
        forge = FORGE_CTRL if kind == "forged-short" else FORGE
        print(forged_lines(forge, True)[0], flush=True)
        turn = 0
        while True:
            print(forged_lines(forge, kind == "forged-short" or turn % 2 == 0)[1], flush=True)
            turn += 1
            time.sleep(0.5)
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
