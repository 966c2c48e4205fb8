"""Issue 37, acceptance 3: in a shared capture folder another user (uid 65534, a real process of
that uid writes the files) drops an out-of-memory report for root's job with a stamp that always
wins, a report naming another pid, and links to root-only files. `gputop memory --last-oom`, as
root, shows only the job's own report; a refused file's error says nothing of its content."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import cli_env, run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")

NOBODY = 65534
SECRET = "root-only-secret-7f3a"


def report(pid: int, message: str, when: float | None = None) -> dict:
    return {"format": "gputop-memory", "version": 1, "kind": "oom", "pid": pid,
            "time": time.time() if when is None else when, "device": "cpu",
            "source": "process", "oom": {"requested": 1 << 20, "message": message, "step": 7}}


def as_nobody(code: str) -> None:
    """Run ``code`` in a real process of uid 65534 (it drops to that uid first, as
    tests/scripts/hostile_agent.py does: the interpreter itself is root's to execute)."""
    drop = f"import os; os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
    done = subprocess.run([sys.executable, "-c", drop + code], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr


@pytest.fixture
def shared(spawn):
    # Outside pytest's (root-only) folder: the other user must reach it.
    folder = Path(tempfile.mkdtemp(prefix="gputop-scratch-", dir="/tmp"))
    folder.chmod(0o1777)  # like /scratch/traces: everyone writes, the sticky bit
    victim = spawn(["sleep", "600"])
    yield folder, victim.pid, cli_env(GPUTOP_CAPTURE_DIR=str(folder))
    shutil.rmtree(folder, ignore_errors=True)


def test_a_forged_report_of_another_user_is_not_shown_for_roots_job(shared):
    folder, pid, env = shared
    stamp = int(time.time() * 1000)
    genuine = folder / f"train_{pid}.{stamp}.oom.json"
    genuine.write_text(json.dumps(report(pid, "the job's own out-of-memory error")))
    forged = json.dumps(report(pid, "FORGED by another user"))
    as_nobody(f"open({str(folder / f'x_{pid}.9999999999999999.oom.json')!r}, 'w')"
              f".write({forged!r})")
    as_nobody(f"open({str(folder / f'x_{pid}.{stamp + 5}.oom.json')!r}, 'w')"
              f".write({forged!r})")
    # Root's own file, but naming another pid: not this job's report either.
    (folder / f"y_{pid}.{stamp + 9}.oom.json").write_text(json.dumps(report(pid + 1, "OTHER")))
    done = run_cli("memory", "--last-oom", str(pid), env=env)
    assert done.returncode == 0, done.stderr
    assert "the job's own out-of-memory error" in done.stdout
    assert "FORGED" not in done.stdout and "OTHER" not in done.stdout
    shown = json.loads(run_cli("memory", "--last-oom", str(pid), "--json", env=env).stdout)
    assert shown["report"] == str(genuine)
    # Without the genuine one there is nothing to show, not the forgery.
    genuine.unlink()
    done = run_cli("memory", "--last-oom", str(pid), env=env)
    assert done.returncode == 1 and "FORGED" not in done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_another_users_link_is_not_followed_and_the_error_tells_nothing(shared, tmp_path):
    folder, pid, env = shared
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    for name, text in (("secret.json", json.dumps({"password": SECRET})),
                       ("report.json", json.dumps(report(pid, SECRET))),
                       ("shadow", f"root:{SECRET}:19000:0:99999:7:::\n")):
        (private / name).write_text(text)
        (private / name).chmod(0o600)
        link = folder / f"link-{name}"
        as_nobody(f"import os; os.symlink({str(private / name)!r}, {str(link)!r})")
        done = run_cli("memory", "--last-oom", str(link), env=env)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert SECRET not in done.stdout + done.stderr
        assert "symbolic link" in done.stderr and len(done.stderr.splitlines()) == 1
    # Named as the job's report, the link is passed over too.
    as_nobody(f"import os; os.symlink({str(private / 'report.json')!r}, "
              f"{str(folder / f'z_{pid}.{int(time.time() * 1000)}.oom.json')!r})")
    done = run_cli("memory", "--last-oom", str(pid), env=env)
    assert done.returncode == 1 and SECRET not in done.stdout + done.stderr
    # Root's own link to its own file is followed (a link the caller made is the caller's).
    own = folder / "own-link.json"
    os.symlink(private / "report.json", own)
    assert run_cli("memory", "--last-oom", str(own), env=env).returncode == 0


@pytest.mark.parametrize("when", [1e308, -1e18])
def test_a_report_time_out_of_any_calendar_is_one_line(tmp_path, when):
    path = tmp_path / "oom.json"
    path.write_text(json.dumps(report(42, "boom", when)))
    done = run_cli("memory", "--last-oom", str(path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "time" in done.stderr


def test_forty_newer_forgeries_do_not_hide_roots_report_and_one_opened_says_whose(shared):
    folder, pid, env = shared
    stamp = int(time.time() * 1000) - 60_000
    genuine = folder / f"train_{pid}.{stamp}.oom.json"
    genuine.write_text(json.dumps(report(pid, "the job's own out-of-memory error")))
    forged = json.dumps(report(pid, "FORGED by another user"))
    # 40 files of another uid, each newer than root's (and none in the future), more than
    # the candidates tried.
    as_nobody(f"for i in range(40):\n"
              f"    open({str(folder)!r} + f'/x{{i}}_{pid}.{{{stamp} + 1000 + i}}.oom.json', 'w')"
              f".write({forged!r})")
    assert len(list(folder.glob(f"*_{pid}.*.oom.json"))) == 41
    done = run_cli("memory", "--last-oom", str(pid), env=env)
    assert done.returncode == 0, done.stderr
    assert "the job's own out-of-memory error" in done.stdout and "FORGED" not in done.stdout
    # Opened by path, a forgery is shown, and said first to be another user's file.
    one = folder / f"x0_{pid}.{stamp + 1000}.oom.json"
    done = run_cli("memory", "--last-oom", str(one), env=env)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert f"uid {NOBODY}" in first and "not yours" in first, done.stdout
    shown = json.loads(run_cli("memory", "--last-oom", str(one), "--json", env=env).stdout)
    assert shown["owner"].startswith(f"uid {NOBODY}")
    # Root's own file opened by path says nothing of an owner.
    done = run_cli("memory", "--last-oom", str(genuine), env=env)
    assert done.returncode == 0 and "not yours" not in done.stdout
