"""`gputop exporter` on its own: the series of the tour's GPUs (acceptance 4 of issue 16), labels
without pids or free text, the finding clock, and one-line errors for bad options."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputop.core.agent_status import parse_status
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot
from gputop.diagnostics.findings import Finding
from gputop.exporter.metrics import FindingClock, all_families, gpu_families, series_count
from tests.conftest import REPO, SLOW, cli_env, run_cli, wait_for

ALLOWED_LABELS = {"gpu", "UUID", "model_name", "id", "severity", "rank", "quantile", "version",
                  "job_id", "uid",  # a job series: its job and its owner's uid (issue 37)
                  "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace", "container", "hpc_job",
                  "hostname", "driver_version", "cuda_version", "simulated",
                  "category"}  # the goodput ledger's seven categories


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> list:
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(text_string_to_metric_families(response.read().decode()))


@pytest.mark.timeout(3 * SLOW)
def test_series_count_for_the_tours_gpus(spawn):
    port = free_port()
    spawn([sys.executable, "-m", "gputop", "--demo", "tour", "--interval", "1", "exporter",
           "--listen", f"127.0.0.1:{port}"], env=cli_env(), cwd=REPO,
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"

    def findings_up():
        try:
            families = scrape(url)
        except OSError:
            return None
        active = [s for f in families if f.name == "gputop_finding_active" for s in f.samples]
        # The tour raises a finding on most of its GPUs; count once most are in.
        return families if len(active) >= 6 else None

    families = wait_for(findings_up, timeout=2 * SLOW, interval=1.0)
    samples = [s for f in families for s in f.samples]
    gpus = {s.labels["gpu"] for s in samples if s.name == "gputop_gpu_utilization_percent"}
    assert gpus == {str(i) for i in range(10)}
    findings = [s for s in samples if s.name.startswith("gputop_finding_active")]
    own = [s for s in samples if s.name.startswith(("process_", "python_"))]
    print(f"\nseries for 10 GPUs (demo tour): {len(samples)} in all: "
          f"{len(samples) - len(findings) - len(own)} GPU, host and info, "
          f"{len(findings)} for {len(findings) // 2} findings, {len(own)} of the exporter's "
          "own process")
    assert len(samples) < 300
    for s in samples:
        assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
        assert "pid" not in s.labels


def test_the_finding_clock_counts_active_time_per_finding_and_gpu():
    clock = FindingClock()

    def finding(fid: str, severity: str, gpu: int | None, pid: int = 1) -> Finding:
        return Finding(fid, severity, "t", "e", "f", "n", gpu=gpu, pid=pid)

    clock.update([finding("dataloader-stall", "warning", 0)], 1.0)
    clock.update([finding("dataloader-stall", "critical", 0),
                  finding("dataloader-stall", "warning", 0, pid=2),
                  finding("contention", "warning", None)], 1.0)
    clock.update([finding("contention", "warning", None)], 1.5)
    active, seconds = clock.families()
    assert {tuple(s.labels.values()): s.value for s in active.samples} == {
        ("contention", "warning", "", ""): 1.0,
        ("dataloader-stall", "critical", "0", ""): 0.0,  # cleared; the worst severity it had last
    }
    assert {tuple(s.labels.values()): s.value for s in seconds.samples} == {
        ("contention", "", ""): 2.5, ("dataloader-stall", "0", ""): 2.0}
    assert all(s.name == "gputop_finding_active_seconds_total" for s in seconds.samples)


def test_a_lost_gpu_has_only_its_lost_series_and_jobs_are_keyed_by_job_uid_rank_and_gpu():
    agent = {"steps": 120, "steps_per_s": 2.5, "step_time_p50_s": 0.4, "step_time_p95_s": 0.5,
             "dataloader_wait_share": 0.8, "rank": 3}
    snap = Snapshot(time=1.0, host=HostSample("h", cpu_percent=50.0),
                    driver=DriverInfo(True, "570", "12.8"),
                    gpus=(GpuSample(0, uuid="GPU-a", name="A100", util_gpu=20.0,
                                    processes=(ProcSample(42, "python", agent=parse_status(agent),
                                                          uid=1000, create_time=7.5),)),
                          GpuSample(1, uuid="GPU-b", name="A100", lost=True)))
    families = all_families(snap, FindingClock(), "1.0")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families for s in f.samples}
    lost = [k for k in samples if ("gpu", "1") in k[1]]
    assert [k[0] for k in lost] == ["gputop_gpu_lost"] and samples[lost[0]] == 1.0
    job = (("gpu", "0"), ("job_id", "pid:42@7"))
    assert samples[("gputop_job_steps_per_second", (*job, ("rank", "3"), ("uid", "1000")))] == 2.5
    assert samples[("gputop_job_step_time_seconds",
                    (*job, ("quantile", "0.95"), ("rank", "3"), ("uid", "1000")))] == 0.5
    assert samples[("gputop_job_steps_total", (*job, ("rank", "3"), ("uid", "1000")))] == 120
    assert series_count(gpu_families(snap)) == len([k for k in samples
                                                    if k[0].startswith("gputop_gpu_")])


def test_every_memory_is_in_bytes():
    """Prometheus' base units: GPU memory in bytes, as the host's (not dcgm-exporter's MiB)."""
    gib = 1 << 30
    snap = Snapshot(time=1.0, host=HostSample("h", memory_used=3 * gib, memory_total=8 * gib),
                    driver=DriverInfo(True, "570", "12.8"),
                    gpus=(GpuSample(0, uuid="GPU-a", name="A100", mem_used=20 * gib,
                                    mem_total=80 * gib, mem_reserved=gib // 2),))
    samples = {s.name: s.value for f in all_families(snap, FindingClock(), "1.0")
               for s in f.samples}
    memory = {name: v for name, v in samples.items() if "memory" in name and "utilization"
              not in name and "clock" not in name}
    assert memory == {"gputop_gpu_memory_used_bytes": 20 * gib,
                      "gputop_gpu_memory_free_bytes": 59.5 * gib,
                      "gputop_gpu_memory_total_bytes": 80 * gib,
                      "gputop_host_memory_used_bytes": 3 * gib,
                      "gputop_host_memory_total_bytes": 8 * gib}


def test_bad_options_are_one_line_errors(tmp_path):
    cases = [
        (["exporter", "--listen", "nope:port"], 2, "--listen"),
        (["exporter", "--listen", "127.0.0.1:70000"], 2, "out of range"),
        (["exporter", "--tls-cert", "x.pem"], 2, "go together"),
        (["exporter", "--basic-auth-file", str(tmp_path / "missing")], 2, "cannot read"),
    ]
    loose = tmp_path / "users"
    loose.write_text("a:b\n")
    loose.chmod(0o644)
    cases.append((["exporter", "--basic-auth-file", str(loose)], 2, "chmod 600"))
    for args, code, text in cases:
        result = run_cli("--demo", "no-driver", *args)
        assert result.returncode == code, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_a_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--demo", "no-driver", "exporter", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1, result.stderr
    assert "cannot listen on 127.0.0.1" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("gputop: error:")


def _start_exporter(spawn, tmp_path, *extra: str) -> tuple[str, object]:
    port = free_port()
    errors = tmp_path / "stderr"
    spawn([sys.executable, "-m", "gputop", "--demo", "no-driver", "exporter", "--listen",
           f"127.0.0.1:{port}", *extra], env=cli_env(), cwd=REPO, stdout=subprocess.DEVNULL,
          stderr=errors.open("wb"))
    # Not just "serving": the no-driver demo first says "serving host metrics only".
    wait_for(lambda: "/metrics (sampling every" in errors.read_text(), timeout=SLOW)
    return f"127.0.0.1:{port}", errors


def _status(url: str, authorization: str | None = None, context=None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": authorization}
                                     if authorization else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_failed_logins_are_rate_limited(spawn, tmp_path):
    """Ten wrong passwords from one address within a minute, and it gets 429 with Retry-After
    (the right password too, until the failures age out): no guessing at network speed."""
    import base64

    from gputop.exporter.server import LOGIN_WINDOW_S, MAX_FAILED_LOGINS

    users = tmp_path / "users"
    users.write_text("prom:s3cret\n")
    users.chmod(0o600)
    where, errors = _start_exporter(spawn, tmp_path, "--basic-auth-file", str(users))
    url = f"http://{where}/metrics"

    def basic(password: str) -> str:
        return "Basic " + base64.b64encode(f"prom:{password}".encode()).decode()

    assert _status(url, basic("s3cret"))[0] == 200
    assert [_status(url, basic(f"guess{i}"))[0] for i in range(MAX_FAILED_LOGINS)] == \
        [401] * MAX_FAILED_LOGINS
    for password in ("guess", "s3cret"):
        status, headers = _status(url, basic(password))
        assert status == 429
        assert 0 < int(headers["Retry-After"]) <= LOGIN_WINDOW_S
    text = errors.read_text()
    assert f"{MAX_FAILED_LOGINS} failed logins from 127.0.0.1" in text and "Traceback" not in text


def test_the_limiter_forgets_failures_after_the_window():
    from gputop.exporter.server import LoginLimiter

    now = [0.0]
    limiter = LoginLimiter(limit=3, window=60.0, clock=lambda: now[0])
    assert [limiter.failed("a") for _ in range(3)] == [False, False, True]
    assert limiter.locked_for("a") == 60.0 and limiter.locked_for("b") == 0.0
    now[0] = 30.0
    assert limiter.locked_for("a") == 30.0
    now[0] = 60.0
    assert limiter.locked_for("a") == 0.0


def test_clients_that_hang_up_mid_answer_leave_no_traceback(spawn, tmp_path):
    """TLS clients that close without close_notify (SSLEOFError on the server's write) or reset
    the connection: the exporter says nothing and goes on serving."""
    import shutil
    import ssl
    import struct

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make the test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    where, errors = _start_exporter(spawn, tmp_path, "--tls-cert", str(cert), "--tls-key",
                                    str(key))
    host, port = where.split(":")
    context = ssl.create_default_context(cafile=str(cert))
    for abort in (True, False) * 5:
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            tls = context.wrap_socket(raw, server_hostname=host)
            tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + (b"\r\n" if abort else b""))
            if abort:  # a reset: no close_notify, no FIN
                tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            tls.close()
    assert _status(f"https://{where}/metrics", context=context)[0] == 200
    time.sleep(1.0)  # the last request threads have finished writing to stderr
    text = errors.read_text()
    assert "Traceback" not in text and "SSLEOFError" not in text, text
