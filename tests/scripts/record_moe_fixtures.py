"""Record tests/data/fr/moe16: run tests/scripts/fr_moe_job.py under torchrun (16 gloo ranks
on CPU) once per scenario, let the hang settle, kill the job and keep each scenario's dumps as
tests/data/fr/moe16/<scenario>.tar.xz (file times kept: a dump that stopped being refreshed
is one of the things the attribution reads).

    python tests/scripts/record_moe_fixtures.py [SCENARIO ...]

Needs torch (CPU). Takes a minute or two per scenario on a busy 2-core host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data" / "fr" / "moe16"
SCENARIOS = ("sleep", "sigstop", "gil", "two", "killed")
SETTLE_S = 15.0  # after the last fault: every healthy rank is blocked, and dumped since
WORLD = 16


def record(scenario: str) -> Path:
    out = Path(tempfile.mkdtemp(prefix=f"fr_moe_{scenario}_"))
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={WORLD}", "--max-restarts=0", str(HERE / "fr_moe_job.py"),
           scenario, str(out)]
    job = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=open(out / "torchrun.log", "wb"))
    want = {"sleep": 1, "sigstop": 1, "gil": 1, "two": 2, "killed": 1}[scenario]
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            if job.poll() is not None:
                raise SystemExit(f"{scenario}: torchrun exited ({job.returncode}); see "
                                 f"{out / 'torchrun.log'}")
            if len(list((out / "fault").glob("*"))) >= want if (out / "fault").exists() else 0:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"{scenario}: no fault after 600 s")
        time.sleep(SETTLE_S)
    finally:
        for pid_file in (out / "pids").glob("*") if (out / "pids").exists() else ():
            try:
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)
            except (ValueError, OSError):
                pass
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except OSError:
            pass
        job.wait()
    DATA.mkdir(parents=True, exist_ok=True)
    target = DATA / f"{scenario}.tar.xz"
    with tarfile.open(target, "w:xz") as tar:
        for sub, pattern in (("pickle", "nccl_trace_rank_*"), ("json", "nccl_trace_rank_*"),
                             ("groups", "*.json")):
            for f in sorted((out / sub).glob(pattern)):
                if not f.name.endswith(".tmp"):
                    tar.add(f, arcname=f"{scenario}/{sub}/{f.name}")
    print(f"{scenario}: {target} ({target.stat().st_size // 1024} KiB)", flush=True)
    return target


if __name__ == "__main__":
    for name in sys.argv[1:] or SCENARIOS:
        record(name)
