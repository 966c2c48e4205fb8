"""Containers and MIG on a real GPU (issue 29): what the simulated driver cannot show.

    python benchmarks/gpu/check_containers.py          # about 2 minutes, as root

Prints, as JSON lines:

1. ``device_files``: which /dev/nvidia* a CUDA process holds open, with and without
   CUDA_VISIBLE_DEVICES=0 (the elimination in pidns.py relies on a process holding its
   own GPU's file; whether it also holds the others' decides when ranks can be told apart);
2. ``pidns``: a CUDA training job under the agent in its own pid namespace
   (``unshare --pid --fork --mount-proc``), seen by the real NVML from the host (host pid and
   container pid, its agent), from a sibling namespace (named once the host has told the agent
   its host pid) and from the job's own namespace (nsenter: this namespace's pid with the host
   pid); and a capture from each side;
3. ``mig``: the MIG mode of each GPU and, where MIG is already on (this script never changes
   it), what `gputop snapshot --json` lists per MIG device and whether GPM gave activity.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "benchmarks" / "gpu" / "jobs.py"
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
HOLD = ("import torch, time, sys; torch.zeros(1, device='cuda'); print('ready', flush=True); "
        "time.sleep(30)")


def emit(kind: str, **data) -> None:
    print(json.dumps({"check": kind, **data}), flush=True)


def device_files(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            out.append(target)
    return sorted(set(out))


def check_device_files() -> None:
    for visible in (None, "0"):
        env = dict(os.environ)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        proc = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE,
                                text=True)
        try:
            ready = proc.stdout.readline().strip() == "ready"
            emit("device_files", cuda_visible_devices=visible, ready=ready,
                 held=device_files(proc.pid) if ready else None)
        finally:
            proc.kill()
            proc.wait()


def gputop(env, *args: str, prefix: list[str] | None = None, timeout: float = 120):
    return subprocess.run([*(prefix or []), sys.executable, "-m", "gputop", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


def rows(done: subprocess.CompletedProcess) -> list[dict]:
    if done.returncode != 0:
        return [{"error": done.stderr.strip()[-300:]}]
    keep = ("pid", "ns_pid", "host_pid", "visible", "hidden", "cmdline", "gpu_instance", "owner")
    return [{**{k: p.get(k) for k in keep}, "agent": bool(p.get("agent")),
             "agent_host_pid": (p.get("agent") or {}).get("host_pid")}
            for g in json.loads(done.stdout)["gpus"] for p in g["processes"]]


def check_pidns() -> None:
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        emit("pidns", skipped=f"unshare --pid not permitted: {probe.stderr.strip()[:200]}")
        return
    work = Path(tempfile.mkdtemp(prefix="gputop-gpu-pidns-"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUTOP_CAPTURE_DIR": str(work / "captures")}
    job = subprocess.Popen([*UNSHARE, sys.executable, "-m", "gputop", "run", "--",
                            sys.executable, str(JOBS), "healthy", "--seconds", "90"],
                           env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(25)  # CUDA context and the first steps
        children = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True,
                                  text=True).stdout.split()
        host = int(children[0]) if children else None
        emit("pidns", host_pid=host)
        if host is None:
            return
        inside = ["nsenter", "-t", str(host), "-p", "-m"]
        emit("pidns", view="sibling-before-host",
             rows=rows(gputop(env, "snapshot", "--json", prefix=UNSHARE)))
        started = time.monotonic()
        emit("pidns", view="host", rows=rows(gputop(env, "snapshot", "--json")),
             seconds=round(time.monotonic() - started, 2))
        emit("pidns", view="sibling-after-host",
             rows=rows(gputop(env, "snapshot", "--json", prefix=UNSHARE)))
        emit("pidns", view="job-namespace",
             rows=rows(gputop(env, "snapshot", "--json", prefix=inside)))
        for view, prefix, pid in (("host", None, host), ("sibling", UNSHARE, host),
                                  ("job-namespace", inside, 1)):
            done = gputop(env, "capture", str(pid), "--steps", "3", "--json", prefix=prefix,
                          timeout=180)
            result = json.loads(done.stdout) if done.returncode == 0 else {}
            emit("pidns_capture", view=view, rc=done.returncode,
                 verdict=result.get("verdict"), trace=result.get("trace"),
                 error=done.stderr.strip()[-300:] if done.returncode else None)
    finally:
        job.kill()
        job.wait()
        shutil.rmtree(work, ignore_errors=True)


def check_mig() -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        modes = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                modes.append(pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(i)))
            except pynvml.NVMLError as exc:
                modes.append(str(exc))
    finally:
        pynvml.nvmlShutdown()
    emit("mig", modes=modes)
    if any(isinstance(m, list) and m[0] == 1 for m in modes):
        done = gputop({**os.environ, "PYTHONPATH": str(REPO)}, "snapshot", "--json")
        gpus = json.loads(done.stdout)["gpus"] if done.returncode == 0 else []
        emit("mig", snapshot=[{"index": g["index"], "util_gpu": g["util_gpu"],
                               "mig": g.get("mig")} for g in gpus])


if __name__ == "__main__":
    check_device_files()
    check_pidns()
    check_mig()
