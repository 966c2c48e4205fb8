"""A CPU burner of another user: one process spinning per core, for the busy-host checks.

    python benchmarks/cpu_burner.py [--user nobody] [--procs N] [--seconds S] [-- COMMAND...]

Started as root it runs its spinners as ``--user`` (default ``nobody``; ``--create`` makes a
throwaway system user of that name first), so gputop sees another uid use the CPUs; not
root, they run as you. With a COMMAND, the burner runs while the command does and ends with
it (its exit status is the command's): e.g. the README's test command beside a burner, or

    python benchmarks/cpu_burner.py --create --user gputop-burner -- \\
        gputop --demo input-starved watch --json --duration 40

which should raise ``cpu-contention`` naming the user ``gputop-burner``.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time

SPIN = "while :; do :; done"


def ensure_user(name: str, create: bool) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        if not create or shutil.which("useradd") is None:
            raise SystemExit(f"cpu_burner: no user {name!r} (use --create as root)") from None
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", name], capture_output=True, text=True)
    if made.returncode not in (0, 9):  # 9: made meanwhile
        raise SystemExit(f"cpu_burner: cannot create {name}: {made.stderr.strip()}")
    return pwd.getpwnam(name)


def start_burners(procs: int, user: pwd.struct_passwd | None) -> list[subprocess.Popen]:
    """``procs`` spinning shells, as ``user`` where we may switch to it."""
    def drop() -> None:
        if user is not None:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

    return [subprocess.Popen(["/bin/sh", "-c", SPIN], preexec_fn=drop, cwd="/",
                             stdin=subprocess.DEVNULL, start_new_session=True)
            for _ in range(procs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user", default="nobody")
    parser.add_argument("--create", action="store_true", help="create --user if missing")
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=0.0, help="without a command: how long")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    user = ensure_user(args.user, args.create) if os.geteuid() == 0 else None
    burners = start_burners(args.procs, user)
    print(f"cpu_burner: {args.procs} spinners as {user.pw_name if user else 'you'}",
          file=sys.stderr, flush=True)
    try:
        if command:
            return subprocess.call(command)
        if args.seconds:
            time.sleep(args.seconds)
        else:
            signal.pause()
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
