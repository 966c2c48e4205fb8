"""`gputop run [--] CMD [ARGS...]`: run a training command with the gputop agent in it.

The agent reaches every Python process of the job (torchrun ranks, a shell script's python)
through a ``sitecustomize`` placed first on PYTHONPATH; it chains to any sitecustomize the job
already had. gputop then *replaces itself* with the command (exec), so the job has gputop's pid,
gets Ctrl-C and every other signal directly, and its exit status is the command's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from gputop.core.errors import UsageError

FR_ENV_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_BUFFER_DEFAULT = 2000  # entries of Flight Recorder's ring that `gputop run` turns on
BOOT_DIR = Path(__file__).resolve().parent.parent / "agent" / "boot"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "run",
        parents=[common],
        help="run a training command with the agent loaded (enables `gputop capture`)",
        description=(
            "Run CMD with the gputop agent loaded in each of its Python processes (never in "
            "DataLoader workers). The command replaces gputop: same pid, signals and exit "
            "status. Flight Recorder is turned on (TORCH_FR_BUFFER_SIZE=2000) unless the job sets "
            "TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE itself (set it to 0 to keep it "
            "off); `gputop hang` reads it. Example: gputop run -- torchrun --nproc-per-node 2 "
            "train.py"
        ),
    )
    parser.add_argument(
        "--capture-dir",
        metavar="DIR",
        help="where the job's agents write traces (sets GPUTOP_CAPTURE_DIR for the job)",
    )
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]")


def job_environment(base: dict[str, str], capture_dir: str | None = None) -> dict[str, str]:
    """The job's environment: our sitecustomize first on PYTHONPATH."""
    env = dict(base)
    boot = str(BOOT_DIR)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *parts])
    if not any(env.get(name) for name in FR_ENV_NAMES):
        # Flight Recorder on (a ring of the last collectives per rank, a few hundred bytes
        # each): `gputop hang` reads it when the job hangs. The job's own setting wins.
        env[FR_ENV_NAMES[0]] = str(FR_BUFFER_DEFAULT)
    if capture_dir:
        env["GPUTOP_CAPTURE_DIR"] = os.path.abspath(os.path.expanduser(capture_dir))
    return env


def run(args: argparse.Namespace) -> int:
    job = list(args.job or [])
    if job and job[0] == "--":
        job = job[1:]
    if not job:
        raise UsageError("gputop run needs a command, e.g. `gputop run -- python train.py`")
    program = shutil.which(job[0]) if os.sep not in job[0] else job[0]
    if program is None or not os.path.exists(program):
        raise UsageError(f"command not found: {job[0]}", exit_code=127)
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        raise UsageError(f"not executable: {job[0]}", exit_code=126)
    env = job_environment(dict(os.environ), args.capture_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, job, env)
    except OSError as exc:
        raise UsageError(f"cannot run {job[0]}: {exc.strerror}", exit_code=126) from None
    return 127  # not reached
