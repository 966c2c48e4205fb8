"""cpu-contention: a real CPU job beside a real CPU burner of another uid, measured from the
kernel's accounting (schedstat run-queue wait, cgroup throttling); the rule's thresholds and its
place ahead of the symptoms it inflates on scripted histories."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.collect.cpu_wait import cgroup_of, cpu_pressure, throttling
from gputop.collect.host import HostCollector
from gputop.core.model import (
    CpuUser,
    CpuWait,
    DriverInfo,
    GpuSample,
    HostSample,
    ProcSample,
    Snapshot,
    WorkerSample,
)
from gputop.core.snapshot_json import decode_snapshot, snapshot_to_json
from gputop.diagnostics.live import LiveDiagnosis, evaluate
from gputop.diagnostics.live.common import WINDOW_S
from gputop.diagnostics.live.cpu import CONTENDED, OTHERS_MIN, THROTTLED_MIN

GIB = 1024**3
BURNER_USER = "gputop-burner"
# A job of two busy threads of execution: the process and one forked worker, both spinning.
JOB = ("import os, time\n"
       "if os.fork() == 0:\n"
       "    while True: pass\n"
       "print('ready', flush=True)\n"
       "while True: pass\n")

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")


def burner_user() -> pwd.struct_passwd:
    """A second, unprivileged uid (made with useradd where missing)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a burner as another user")
    try:
        return pwd.getpwnam(BURNER_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip(f"needs useradd to create {BURNER_USER}")
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                               "/usr/sbin/nologin", BURNER_USER], capture_output=True, text=True)
        if made.returncode not in (0, 9):  # 9: made meanwhile by a parallel run
            pytest.skip(f"cannot create {BURNER_USER}: {made.stderr.strip()}")
        return pwd.getpwnam(BURNER_USER)


BURNER = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_burner.py"


@pytest.fixture
def burner():
    """benchmarks/cpu_burner.py: a spinner per core as the second uid. Not a child of this
    process: gputop counts its own children (a demo's stand-ins) as its own, not others'."""
    user = burner_user()
    proc = subprocess.Popen([sys.executable, str(BURNER), "--user", user.pw_name,
                             "--seconds", "120"], stderr=subprocess.PIPE, text=True)
    try:
        assert "spinners as" in proc.stderr.readline()
        yield user
    finally:
        proc.send_signal(signal.SIGINT)  # it kills its spinners on the way out
        proc.wait(timeout=60)


@pytest.fixture
def job():
    proc = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        kids = children.read_text().split() if children.exists() else []
        proc.kill()
        proc.wait()
        for kid in kids:
            try:
                os.kill(int(kid), 9)
            except ProcessLookupError:
                pass


def watched(pid: int, seconds: float = 6.0, tick: float = 0.5) -> list[Snapshot]:
    """Snapshots of the real process ``pid`` on a (simulated) GPU kept 20 % busy: the host
    side is psutil's and the kernel's, read as the live monitor reads it."""
    host = HostCollector()
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hs = host.sample_host()
        ps = host.sample_process(pid, gpu_mem=10 * GIB)
        host.end_tick()
        out.append(Snapshot(time.time(), hs, DriverInfo(True), (GpuSample(
            index=0, util_gpu=20.0, mem_used=20 * GIB, mem_total=80 * GIB, processes=(ps,)),)))
        time.sleep(tick)
    return out


def measured_share(snaps: list[Snapshot], pid: int) -> float:
    run = wait = 0.0
    for s in snaps[-20:]:
        for p in s.gpus[0].processes:
            if p.pid == pid and p.cpu_wait is not None:
                run += p.cpu_wait.run_s
                wait += p.cpu_wait.wait_s
    assert run + wait > 0
    return wait / (run + wait)


def test_a_burner_of_another_user_is_named_and_the_wait_measured(job, burner):
    user = burner
    snaps = watched(job.pid)
    # The job's two spinning threads and one per core of the burner's: the job wanted a CPU
    # all the time and had one at most (cores / threads wanting one) of it.
    share = measured_share(snaps, job.pid)
    assert share >= CONTENDED, share
    assert any(u.user == user.pw_name for s in snaps for u in s.host.cpu_users)
    assert all(u.top is None for s in snaps for u in s.host.cpu_users if u.user == user.pw_name)
    found = [f for f in evaluate(snaps, own_pid=os.getpid()) if f.id == "cpu-contention"]
    assert len(found) == 1, found
    assert f"user {user.pw_name} " in found[0].evidence and str(job.pid) in found[0].title
    assert "schedstat" in found[0].evidence
    # Another user's processes by user only: no command of theirs in the evidence.
    assert "sh (pid" not in found[0].evidence


def test_without_the_burner_the_answer_follows_the_measured_wait(job):
    snaps = watched(job.pid)
    share = measured_share(snaps, job.pid)
    users = next((s.host.cpu_users for s in reversed(snaps) if s.host.cpu_users), ())
    others = sum(u.cpu_percent for u in users)
    found = [f for f in evaluate(snaps, own_pid=os.getpid()) if f.id == "cpu-contention"]
    # A quiet host: none; a host busy with other work: raised, from what the kernel measured.
    assert bool(found) == (share >= CONTENDED and others >= OTHERS_MIN), (share, users)
    assert all(BURNER_USER not in f.evidence for f in found)


def test_a_cgroup_cpu_quota_is_named_as_such(job):
    group = cgroup_of(os.getpid())
    if group is None or os.geteuid() != 0:
        pytest.skip("needs root and a CPU cgroup controller")
    parent = Path(group.stat).parent
    made = parent / f"gputop-quota-{os.getpid()}"
    try:
        made.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup here: {exc}")
    children = [int(c) for c in
                Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()]
    try:
        v2 = (made / "cpu.max").exists()
        try:
            if v2:
                (made / "cpu.max").write_text("2000 100000")
            else:
                (made / "cpu.cfs_quota_us").write_text("2000")
            for pid in (job.pid, *children):
                (made / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            pytest.skip(f"cannot set a CPU quota here: {exc}")
        snaps = watched(job.pid)
        found = [f for f in evaluate(snaps, own_pid=os.getpid()) if f.id == "cpu-contention"]
        waits = [p.cpu_wait for s in snaps for p in s.gpus[0].processes if p.cpu_wait]
        assert all(w.quota_cores == 0.02 and w.cgroup.endswith(made.name) for w in waits)
        counts = throttling(str(made / "cpu.stat"))
        assert counts is not None and counts[1] > 0  # the kernel throttled it
        # Named the quota when the kernel throttled the job a share of the window; a host so
        # busy that the job never reached even this quota waits for the others instead.
        throttled = sum(w.throttled_s or 0.0 for w in waits[-20:])
        assert len(found) == 1, waits
        if throttled / WINDOW_S >= THROTTLED_MIN:
            assert "CPU quota (0.02 cores)" in found[0].title, waits
            assert "Kubernetes" in found[0].fix and "--cpus-per-task" in found[0].fix
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.kill()
        job.wait()
        for _ in range(50):
            try:
                made.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # its processes are still being reaped


def test_pressure_reads_psi_or_none(tmp_path):
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=12.50 avg60=3.00 avg300=1.00 total=1\nfull avg10=0.00 avg60=0.00 "
                   "avg300=0.00 total=0\n")
    assert cpu_pressure(str(psi)) == 12.5
    psi.write_text("some avg10=nan\n")
    assert cpu_pressure(str(psi)) is None
    assert cpu_pressure(str(tmp_path / "absent")) is None


# -- the rule on scripted histories ------------------------------------------------------------


def history(wait_s: float, users: tuple[CpuUser, ...], seconds: int = 20) -> list[Snapshot]:
    """A job whose 3 workers run at 90 % of a core with the GPU 20 % busy (a starved input
    pipeline); its threads wait ``wait_s`` per second for a CPU."""
    out = []
    for t in range(seconds):
        proc = ProcSample(pid=100, name="python", cpu_percent=5.0, gpu_mem=30 * GIB, ppid=1,
                          create_time=-3600.0,
                          workers=tuple(WorkerSample(101 + i, "python", 90.0, 1, "running")
                                        for i in range(3)),
                          cpu_wait=CpuWait(run_s=2.0, wait_s=wait_s, threads=4))
        host = HostSample("node", cpu_percent=100.0, cpu_count=2, cpu_users=users,
                          cpu_pressure=80.0)
        out.append(Snapshot(float(t), host, DriverInfo(True), (GpuSample(
            index=0, util_gpu=20.0, mem_used=40 * GIB, mem_total=80 * GIB, processes=(proc,)),)))
    return out


BUSY = (CpuUser("alice", 160.0, 4), CpuUser("root", 20.0, 2, top="sshd (pid 7)"))


def test_contention_is_the_cause_and_the_stall_its_effect():
    diag = LiveDiagnosis()
    for snap in history(wait_s=2.0, users=BUSY):
        diag.update(snap)
    found = diag.findings()
    assert [f.id for f in found] == ["cpu-contention"]
    assert "Its effects" in found[0].evidence and "dataloader-stall" in found[0].evidence
    assert "user alice 160% of a core (4 processes)" in found[0].evidence
    assert "PSI" in found[0].evidence and found[0].severity == "critical"


def test_no_contention_when_the_job_waits_for_itself_or_hardly_waits():
    # Its own threads outnumber the cores, nobody else is busy: the input pipeline's.
    found = evaluate(history(wait_s=2.0, users=(CpuUser("root", 20.0, 2),)))
    assert {f.id for f in found} == {"dataloader-stall"}
    # Others busy, but the job hardly waits.
    found = evaluate(history(wait_s=0.2, users=BUSY))
    assert {f.id for f in found} == {"dataloader-stall"}


def test_the_measurements_round_trip_through_json():
    snap = history(wait_s=1.5, users=BUSY, seconds=1)[0]
    back = decode_snapshot(__import__("json").dumps(snapshot_to_json(snap)).encode())
    assert back.host.cpu_users == BUSY and back.host.cpu_pressure == 80.0
    assert back.gpus[0].processes[0].cpu_wait == snap.gpus[0].processes[0].cpu_wait
    plain = snapshot_to_json(Snapshot(0.0, HostSample("node"), DriverInfo(True)))
    assert "cpu_users" not in plain["host"] and "cpu_pressure" not in plain["host"]


def test_nonsense_from_a_recording_is_no_evidence():
    snaps = history(wait_s=2.0, users=BUSY)
    bad = [Snapshot(s.time, s.host, s.driver, (GpuSample(
        index=0, util_gpu=20.0, mem_used=40 * GIB, mem_total=80 * GIB,
        processes=(ProcSample(pid=100, name="python", gpu_mem=GIB, create_time=-3600.0,
                              cpu_wait=CpuWait(run_s=-1.0, wait_s=1e300, threads=1)),)),))
           for s in snaps]
    assert "cpu-contention" not in {f.id for f in evaluate(bad)}
