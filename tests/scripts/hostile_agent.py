"""A hostile "agent": another user's process that answers a capture with a trace path meant to
hurt whoever reads it (a FIFO, /dev/zero, a link to a root-only file, a 5 GB sparse file, or a
message full of terminal escapes).

Run as root with ``--uid``: it drops to that uid first, so it is another user's process in every
respect (its socket directory, its files, SO_PEERCRED). Speaks gputop's real wire format.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile


def make_target(kind: str, home: str) -> str:
    path = os.path.join(home, f"trace-{kind}")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        return "/dev/zero"
    elif kind == "symlink":
        os.symlink("/etc/shadow", path)
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(5 * 1024**3)
    elif kind == "rootfile":
        return "/etc/shadow"
    return path


def absurd_status() -> dict:
    """A status meant to take over a victim's job series (issue 37): no rank, the fastest
    steps, and every number outside its meaning."""
    return {"ok": True, "pid": os.getpid(), "rank": None, "job_id": "launcher:1",
            "steps": -5, "steps_per_s": 1e9, "step_time_p50_s": -1.0,
            "step_time_p95_s": 1e300, "dataloader_wait_share": 7.5, "sync_wait_share": -0.5,
            "host_busy_share": 3.0,
            "goodput": {"goodput": 1.0, "seconds": {"productive": 0.0, "stall": 5.0,
                                                    "hang": 5.0}},
            "flops": {"state": "done", "last": {"ok": True, "flops_per_step": 1e30,
                                                "precision": "fp32", "samples_per_step": 1}},
            # torch.compile's figures too: refused, never clamped to one that is shown.
            "compile": {"compiles": 2**62, "recompiles": 2**62, "compile_s": 1e300,
                        "blocked_after_warmup_s": -3.0, "cudagraph": {"rerecords": 2**62},
                        "functions": [{"function": "step", "compiles": 2**62, "line": 10**12}]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--kind", required=True,
                        choices=["fifo", "devzero", "symlink", "sparse", "rootfile", "escapes",
                                 "absurd"])
    args = parser.parse_args()
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(args.uid)
        os.setuid(args.uid)
    home = tempfile.mkdtemp(prefix="hostile-")  # ours (0700), like a user's capture dir
    directory = f"/tmp/gputop-{args.uid}"
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    trace = None if args.kind in ("escapes", "absurd") else make_target(args.kind, home)
    path = os.path.join(directory, f"{os.getpid()}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    print(f"ready {home}", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data:
                continue
            cmd = json.loads(data).get("cmd")
            if cmd == "capture" and trace is not None:
                reply = {"ok": True, "trace": trace}
            elif cmd == "capture":
                reply = {"ok": False, "error": "busy\x1b[2J",
                         "message": "pwned\x1b]0;owned\x07\x1b[2J\u202e"}
            elif args.kind == "absurd":
                reply = absurd_status()
            else:
                reply = {"ok": True, "pid": os.getpid(), "steps": 0}
            conn.sendall(json.dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    sys.exit(main())
