"""Who owns a GPU process (issue 29): container, Kubernetes pod and Slurm job, read from the
process's real cgroups, mounts and environment, shown in `snapshot --json`, the process table's
text and the exporter's series with dcgm-exporter's label names.

The acceptance test makes real cgroup directories shaped like a Kubernetes pod's and
container's (cgroup v2 where /sys/fs/cgroup is the unified hierarchy, else a v1 controller's
hierarchy), moves a real process into them, and lays out the kubelet's log directories the way
a node has them; it skips, saying why, where it may not write there."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gputop.collect.containers import (
    CONTAINER_LOGS,
    KUBELET_PODS,
    POD_LOGS,
    owner_from_cgroups,
    read_owner,
)
from gputop.core.model import Owner
from gputop.core.process_info import label_values, owner_text
from tests.conftest import REPO, SLOW, cli_env, run_cli, wait_for
from tests.test_exporter import free_port, scrape

CID = "0123456789abcdef" * 4
UID = "8f2c7a4e-1b3d-4c5e-9f6a-7b8c9d0e1f2a"


@pytest.mark.parametrize(("path", "expected"), [
    # Kubernetes with the systemd cgroup driver and containerd (cgroup v2).
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}"
     f".slice/cri-containerd-{CID}.scope",
     Owner(runtime="containerd", container_id=CID, pod_uid=UID)),
    # Kubernetes with the cgroupfs driver (v1): the runtime is not in the path.
    (f"4:memory:/kubepods/besteffort/pod{UID}/{CID}",
     Owner(runtime="kubernetes", container_id=CID, pod_uid=UID)),
    (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
     Owner(runtime="cri-o", container_id=CID, pod_uid=UID)),
    (f"0::/system.slice/docker-{CID}.scope", Owner(runtime="docker", container_id=CID)),
    (f"3:cpu:/docker/{CID}", Owner(runtime="docker", container_id=CID)),
    (f"0::/machine.slice/libpod-{CID}.scope", Owner(runtime="podman", container_id=CID)),
    ("4:memory:/slurm/uid_1000/job_4242/step_0/task_0", Owner(slurm_job="4242")),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0",
     Owner(slurm_job="4242")),
    # Not a container: a 32-hex cgroup of some other manager, a plain user session.
    ("4:memory:/process_api/11f9c8a3251a55f282059a4ae1027df9", Owner()),
    ("0::/user.slice/user-1000.slice/session-3.scope", Owner()),
    # Inside a container with its own cgroup namespace the path tells nothing.
    ("0::/", Owner()),
])
def test_cgroup_paths_name_runtime_container_pod_and_job(path, expected):
    assert owner_from_cgroups([path.split(":", 2)[2]]) == expected


def test_labels_use_dcgm_exporter_names_and_fall_back_to_ids():
    assert label_values(None) == {"pod": "", "namespace": "", "container": "", "hpc_job": ""}
    owner = Owner(runtime="containerd", container_id=CID, pod_uid=UID, slurm_job="7")
    assert label_values(owner) == {"pod": UID, "namespace": "", "container": CID[:12],
                                   "hpc_job": "7"}
    named = Owner(pod="trainer-0", namespace="ml", container="main", pod_uid=UID)
    assert owner_text(named) == "pod ml/trainer-0/main"


# -- the acceptance test --------------------------------------------------------------------


def _writable_hierarchy() -> Path | None:
    """The unified cgroup v2 hierarchy, else a v1 controller's (pids first): where a test may
    make cgroups."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return root
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    v1 = [line.split(" - ")[0].split()[4] for line in mounts
          if " - cgroup " in line and "/sys/fs/cgroup/" in line]
    v1.sort(key=lambda p: (not p.endswith("/pids"), p))
    return Path(v1[0]) if v1 else None


@pytest.fixture
def pod_cgroup():
    """A real cgroup shaped like a Kubernetes pod's container (systemd driver, containerd):
    yields (its directory, the pod uid, the container id); removed afterwards."""
    hierarchy = _writable_hierarchy()
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy mounted under /sys/fs/cgroup")
    pod_uid = str(uuid.uuid4())
    container_id = secrets.token_hex(32)
    parts = ["kubepods.slice", "kubepods-besteffort.slice",
             f"kubepods-besteffort-pod{pod_uid.replace('-', '_')}.slice",
             f"cri-containerd-{container_id}.scope"]
    made: list[Path] = []
    path = hierarchy
    try:
        for part in parts:
            path = path / part
            if not path.exists():
                path.mkdir()
                made.append(path)
    except OSError as exc:
        for p in reversed(made):
            p.rmdir()
        pytest.skip(f"cgroupfs is not writable here ({hierarchy}: {exc.strerror})")
    yield path, pod_uid, container_id
    # The test's processes may still be there (the spawn fixture ends them later): move them
    # back to the root cgroup, then remove the directories, leaf first.
    for pid in (path / "cgroup.procs").read_text().split():
        try:
            (hierarchy / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            pass
    for p in reversed(made):
        p.rmdir()


@pytest.fixture
def kubelet_logs():
    """The kubelet's log layout for one pod and container, as a node has it: yields a
    function ``make(namespace, pod, uid, container, container_id)``; removed afterwards."""
    made: list[Path] = []

    def make(namespace: str, pod: str, uid: str, container: str, container_id: str) -> None:
        pod_dir = Path(POD_LOGS) / f"{namespace}_{pod}_{uid}"
        link = Path(CONTAINER_LOGS) / f"{pod}_{namespace}_{container}-{container_id}.log"
        try:
            _make_dirs(Path(CONTAINER_LOGS), made)
            _make_dirs(pod_dir / container, made)
            (pod_dir / container / "0.log").write_text("")
            link.symlink_to(pod_dir / container / "0.log")
            made.append(link)
        except OSError as exc:
            pytest.skip(f"cannot lay out the kubelet's logs under /var/log ({exc.strerror})")

    yield make
    for path in reversed(made):
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


def _make_dirs(path: Path, made: list[Path]) -> None:
    """mkdir -p, noting every directory made (to remove them afterwards, deepest first)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir()
        made.append(directory)


def _sleeper(spawn, **env: str) -> subprocess.Popen:
    proc = spawn([sys.executable, "-c", "import time; time.sleep(600)"],
                 env={**os.environ, **env})
    return proc


@pytest.mark.timeout(4 * SLOW)
def test_pod_container_and_slurm_job_show_in_snapshot_and_exporter(spawn, pod_cgroup,
                                                                   kubelet_logs):
    cgroup, pod_uid, container_id = pod_cgroup
    kubelet_logs("ml-team", "trainer-0", pod_uid, "main", container_id)
    in_pod = _sleeper(spawn)
    (cgroup / "cgroup.procs").write_text(f"{in_pod.pid}\n")
    assert container_id in Path(f"/proc/{in_pod.pid}/cgroup").read_text()
    slurm = _sleeper(spawn, SLURM_JOB_ID="4242", SLURM_JOB_NAME="train")

    # The two real processes stand on the two simulated H100s of `throttled`.
    env = cli_env(GPUTOP_DEMO_PIDS=f"0:{in_pod.pid},1:{slurm.pid}")
    done = run_cli("--demo", "throttled", "snapshot", "--json", env=env)
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)["gpus"]
    pod_proc, slurm_proc = gpus[0]["processes"][0], gpus[1]["processes"][0]
    assert pod_proc["pid"] == in_pod.pid and slurm_proc["pid"] == slurm.pid
    assert pod_proc["owner"] == {"runtime": "containerd", "container_id": container_id,
                                 "pod_uid": pod_uid, "pod": "trainer-0",
                                 "namespace": "ml-team", "container": "main"}
    assert slurm_proc["owner"] == {"slurm_job": "4242"}

    text = run_cli("--demo", "throttled", "snapshot", env=env)
    assert "pod ml-team/trainer-0/main" in text.stdout and "slurm 4242" in text.stdout

    port = free_port()
    spawn([sys.executable, "-m", "gputop", "--demo", "throttled", "--interval", "0.5",
           "exporter", "--listen", f"127.0.0.1:{port}"], env=env, cwd=REPO,
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def labelled():
        try:
            families = scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return None
        series = {s.labels["gpu"]: s.labels for f in families for s in f.samples
                  if s.name == "gputop_gpu_memory_used_bytes"}
        return series if series.get("0", {}).get("pod") else None

    series = wait_for(labelled, timeout=SLOW, interval=0.5)
    assert (series["0"]["pod"], series["0"]["namespace"], series["0"]["container"]) == \
        ("trainer-0", "ml-team", "main")
    assert series["0"]["hpc_job"] == ""
    assert series["1"]["hpc_job"] == "4242" and series["1"]["pod"] == ""


def test_inside_a_pod_the_kubelet_mounts_name_pod_and_container(spawn):
    """Seen from inside a pod, the cgroup path is "/" (its own cgroup namespace); the kubelet's
    bind mount of the container's termination log names the pod uid and the container, and
    the hostname (the pod's name) names the pod."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    pod_uid = str(uuid.uuid4())
    source = Path(KUBELET_PODS) / pod_uid / "containers" / "main" / "3f1c2b9a"
    made: list[Path] = []
    try:
        _make_dirs(source.parent, made)
        source.write_text("")
    except OSError as exc:
        pytest.skip(f"cannot make {KUBELET_PODS} here ({exc.strerror})")
    target = Path(f"/tmp/gputop-termination-log-{os.getpid()}")
    target.write_text("")
    try:
        # A private mount namespace with the bind mount the kubelet makes for every container.
        proc = spawn(["unshare", "--mount", "sh", "-c",
                      f"mount --bind {source} {target} && exec sleep 600"],
                     env={**os.environ, "HOSTNAME": "trainer-0"})

        def mounted():
            try:
                return source.parent.as_posix() in Path(f"/proc/{proc.pid}/mountinfo").read_text()
            except OSError:
                return False

        try:
            wait_for(mounted, timeout=30)
        except AssertionError:
            pytest.skip("unshare --mount with a bind mount is not permitted here")
        owner = read_owner(proc.pid)
        assert owner is not None
        assert (owner.runtime, owner.pod_uid, owner.container, owner.pod) == \
            ("kubernetes", pod_uid, "main", "trainer-0")
    finally:
        for path in reversed(made):
            shutil.rmtree(path, ignore_errors=True)
        target.unlink(missing_ok=True)
