"""The demo's stand-in processes: real CPU behaviour, and they die with gputop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from tests.conftest import REPO, SLOW, cli_env, wait_for

HOLDER = textwrap.dedent(
    f"""
    import time
    from gputop.client.session import open_sampler
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
    from gputop.client.session import open_sampler

    with open_sampler("tour", wait_for_workers=SLOW) as sampler:
        snap = sampler.sample()
        pids = [p.pid for g in snap.gpus for p in g.processes if p.visible]
        pids += [w.pid for g in snap.gpus for p in g.processes for w in p.workers]
        assert len(pids) >= 8
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                             for p in pids), timeout=SLOW)


def test_a_gputop_folder_where_gputop_is_started_cannot_shadow_the_standins(spawn, tmp_path):
    """gputop started from a folder that holds a `gputop/` directory (the parent of a checkout,
    another project of that name): its stand-ins still run this gputop, and fork their
    workers."""
    work, bin_ = tmp_path / "work", tmp_path / "bin"
    (work / "gputop").mkdir(parents=True)
    (work / "gputop" / "__init__.py").write_text("raise ImportError('the shadow was imported')\n")
    bin_.mkdir()
    (bin_ / "holder.py").write_text(HOLDER.replace('"input-starved",',
                                                   '"input-starved", trainer=False,'))
    holder = spawn([sys.executable, str(bin_ / "holder.py")], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=work)
    line = holder.stdout.readline()
    assert len(line.split()) == 3, holder.stderr.read() if holder.poll() is not None else line


def broken_torch(tmp_path) -> str:
    """A folder whose torch.py fails to import (a broken install): first on PYTHONPATH, the
    demo's trainer cannot start."""
    broken = tmp_path / "site"
    broken.mkdir()
    (broken / "torch.py").write_text("raise ImportError('torch is broken here')\n")
    return str(broken)


def test_a_standin_that_fails_is_said_in_one_line(tmp_path):
    """The demo's trainer cannot import torch: one line names the GPU, the stand-in and the
    error; `watch` goes on."""
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([broken_torch(tmp_path), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-m", "gputop", "--demo", "input-starved", "watch",
                           "--duration", "6", "--no-where"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=SLOW)
    assert done.returncode == 0, done.stderr
    failed = [line for line in done.stderr.splitlines() if "stand-in" in line]
    assert failed == ["gputop: warning: demo: the stand-in of GPU 0 (python -m gputop.demo.train)"
                      " exited with status 1: ImportError: torch is broken here"], done.stderr


def test_in_the_monitor_a_standin_that_fails_is_a_notification(tmp_path, monkeypatch):
    """The same in the live monitor, started as `gputop top` starts it (sampling begins before
    the app exists, so the line waits for the app)."""
    import asyncio

    from gputop.tui.monitor.app import GputopApp
    from gputop.tui.monitor.early_start import EarlySampler

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [broken_torch(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def told(app) -> list[str]:
        return [n.message for n in app._notifications if "stand-in" in n.message]

    async def run() -> list[str]:
        early = EarlySampler("input-starved", None, 0).start()
        app = GputopApp(demo="input-starved", early=early)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                deadline = time.monotonic() + SLOW
                while not told(app) and time.monotonic() < deadline:
                    await pilot.pause(0.1)
                return told(app)
        finally:
            early.stop()

    assert asyncio.run(run()) == ["demo: the stand-in of GPU 0 (python -m gputop.demo.train) "
                                  "exited with status 1: ImportError: torch is broken here"]
