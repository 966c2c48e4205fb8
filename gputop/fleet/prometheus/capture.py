"""`p` on a node of `gputop --prometheus`: the ssh capture of `--hosts`, for a node that runs
gputop. Prometheus names no process, so the node's own gputop is asked first which process
holds the GPU (`gputop snapshot --json` over ssh), then `fleet.capture` captures it. Blocks:
run it in a thread. Raises ``RemoteCaptureError`` with one line."""

from __future__ import annotations

import subprocess

from gputop.core.snapshot_json import WireError, decode_snapshot, one_line
from gputop.fleet.capture import RemoteCapture, RemoteCaptureError, run_remote_capture
from gputop.fleet.ssh import SshSettings

SNAPSHOT_TIMEOUT_S = 30.0
MAX_SNAPSHOT = 16 * 1024 * 1024


def training_pid(settings: SshSettings, host: str, gpu: int | None) -> int:
    argv = settings.ssh_argv(host, settings.gputop_command("snapshot", "--json"))
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=SNAPSHOT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RemoteCaptureError(f"{host}: gputop snapshot: {one_line(exc, 120)}") from None
    if done.returncode != 0 or len(done.stdout) > MAX_SNAPSHOT:
        line = one_line(done.stderr.decode(errors="replace").strip().splitlines()[-1:] or
                        ["no answer"], 160)
        raise RemoteCaptureError(f"{host}: gputop snapshot: {line}")
    try:
        snap = decode_snapshot(done.stdout.strip())
    except WireError as exc:
        raise RemoteCaptureError(f"{host}: gputop snapshot: {exc}") from None
    procs = [p for g in snap.gpus if gpu is None or g.index == gpu for p in g.processes
             if p.visible]
    if not procs:
        where = f"GPU {gpu} of {host}" if gpu is not None else host
        raise RemoteCaptureError(f"no process on {where}")
    return max(procs, key=lambda p: (p.agent is not None, p.gpu_mem or 0)).pid


def capture_node(settings: SshSettings, host: str, gpu: int | None, steps: int = 3
                 ) -> RemoteCapture:
    return run_remote_capture(settings, host, training_pid(settings, host, gpu), steps)
