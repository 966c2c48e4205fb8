"""The demo's stand-in processes: real CPU behaviour, and they die with gputop."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import psutil

from tests.conftest import SLOW, cli_env, wait_for

HOLDER = textwrap.dedent(
    f"""
    import time
    from gputop.session import open_sampler
    with open_sampler("input-starved", wait_for_workers={SLOW}) as sampler:
        snap = sampler.sample()
        proc = snap.gpus[0].processes[0]
        print(proc.pid, *[w.pid for w in proc.workers], flush=True)
        time.sleep(120)
    """
)


def test_standins_die_when_gputop_is_killed(spawn):
    holder = spawn([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                   env=cli_env())
    pids = [int(p) for p in holder.stdout.readline().split()]
    assert len(pids) == 3  # the stand-in and its two workers
    assert all(psutil.pid_exists(p) for p in pids)
    holder.send_signal(signal.SIGKILL)  # no cleanup code runs in the holder
    holder.wait(SLOW)

    def all_gone():
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return not alive

    wait_for(all_gone, timeout=SLOW)


def test_session_exit_stops_standins():
    from gputop.session import open_sampler

    with open_sampler("tour", wait_for_workers=SLOW) as sampler:
        snap = sampler.sample()
        pids = [p.pid for g in snap.gpus for p in g.processes if p.visible]
        pids += [w.pid for g in snap.gpus for p in g.processes for w in p.workers]
        assert len(pids) >= 8
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                             for p in pids), timeout=SLOW)
