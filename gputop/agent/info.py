"""What the agent says about its process in reply to ``hello``."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from typing import Any

from gputop import __version__
from gputop.core.protocol import PROTOCOL_VERSION

_MAX_ARGS = 64
_MAX_ARG_CHARS = 512


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def process_start_time() -> float | None:
    """Unix time the process started, from /proc (Linux); None elsewhere."""
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5), counted after "pid (comm)"
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return int(line.split()[1]) + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return None


def distributed_info() -> dict[str, int | str | None]:
    """Rank, local rank, world size and job id: from torch.distributed once the program has
    initialised it, else from the launcher's environment (torchrun, SLURM, MPI)."""
    info: dict[str, int | str | None] = {
        "rank": _int_env("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
        "local_rank": _int_env("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
        "world_size": _int_env("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
        "local_world_size": _int_env("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    }
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            info["rank"] = dist.get_rank()
            info["world_size"] = dist.get_world_size()
            info["backend"] = str(dist.get_backend())
    except Exception:
        pass  # never let a probe disturb the job
    info["job_id"] = job_id()
    return info


def job_id() -> str:
    """What the ranks of one job share and no other job on the node has: torchrun's run id
    (with its rendezvous endpoint: the default run id "none" is shared by every job), SLURM's
    job and step, else the launcher's pid (the ranks' common parent)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run:
        endpoint = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
        return f"torchrun:{run}@{endpoint}" if run == "none" else f"torchrun:{run}"
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm:
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm:{slurm}" + (f".{step}" if step else "")
    return f"launcher:{os.getppid()}"


def _cuda_available(torch: Any) -> bool | None:
    """True/False when known without side effects; None when only probing could tell.

    ``torch.cuda.is_available()`` would initialise the CUDA driver in a program that has not
    touched CUDA yet, which can break a later fork (DataLoader workers); we never do that.
    """
    try:
        if (
            getattr(torch.version, "cuda", None) is None
            and getattr(torch.version, "hip", None) is None
        ):
            return False
        if torch.cuda.is_initialized():
            return bool(torch.cuda.is_available())
    except Exception:
        pass
    return None


def hello(started_at: float) -> dict[str, Any]:
    torch = sys.modules.get("torch")
    argv = [str(a)[:_MAX_ARG_CHARS] for a in sys.argv[:_MAX_ARGS]]
    info: dict[str, Any] = {
        "ok": True,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "start_time": process_start_time() or started_at,
        "agent_started_at": started_at,
        "argv": argv,
        "executable": sys.executable,
        "hostname": socket.gethostname(),
        "torch_version": getattr(torch, "__version__", None) if torch is not None else None,
        "cuda_available": _cuda_available(torch) if torch is not None else None,
        "python_version": platform.python_version(),
        "agent_version": __version__,
        "protocol": PROTOCOL_VERSION,
        "time": time.time(),
    }
    info.update(distributed_info())
    return info
