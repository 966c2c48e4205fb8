"""The fleet's parts that need no ssh: naming the nodes, the ssh command line, the stream's
wire format (from a real `gputop stream`, and hostile lines), the rows of the fleet screen,
and the one-line errors of the options."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop.cli import build_parser
from gputop.core.errors import UsageError
from gputop.core.model import DriverInfo, GpuSample, HostSample, Snapshot
from gputop.fleet.monitor import DOWN, NO_GPUTOP, UP, NodeView
from gputop.fleet.monitor import SLOW as SLOW_STATE
from gputop.fleet.ssh import BASE_OPTIONS, SshSettings, settings_from_args
from gputop.fleet.targets import parse_hosts, parse_scontrol_hostnames, read_hostfile
from gputop.fleet.wire import (
    MAX_LINE,
    SCHEMA,
    Hello,
    Sample,
    StreamError,
    WireError,
    decode_line,
    sample_line,
)
from gputop.tui.view.fleet_rows import fleet_findings, fleet_rows
from tests.conftest import REPO, SLOW, cli_env, run_cli


def test_hosts_hostfile_and_scontrol_output(tmp_path):
    assert parse_hosts("a, b,user@c,a,10.0.0.7,fe80::1%eth0") == [
        "a", "b", "user@c", "10.0.0.7", "fe80::1%eth0"]
    for bad in ("-oProxyCommand=sh", "a b", "x;rm", "$(id)", "a\nb"):
        with pytest.raises(UsageError):
            parse_hosts(bad)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the job's nodes\nnode01 slots=8\nnode02, node03  # rack 2\n\nnode01\n")
    assert read_hostfile(str(hostfile)) == ["node01", "node02", "node03"]
    assert parse_scontrol_hostnames("gpu-a01\ngpu-a02\n\ngpu-b07\n") == [
        "gpu-a01", "gpu-a02", "gpu-b07"]


def parse(*argv: str):
    args = build_parser().parse_args(list(argv))
    from gputop.cli import _validate_globals

    _validate_globals(args)
    return args


def test_the_ssh_command_is_the_users_ssh_with_monitor_options(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n")
    args = parse("--demo", "input-starved", "--interval", "2", "--gpus", "0,1", "--hosts",
                 "a", "--ssh-config", str(config), "--ssh-option", "Port=2222",
                 "--remote-gputop", "~/venv/bin/gputop", "watch")
    settings = settings_from_args(args)
    argv = settings.ssh_argv("a", settings.gputop_command("stream"))
    assert argv[:4] == ["ssh", "-T", "-F", str(config)]
    options = [argv[i + 1] for i, word in enumerate(argv) if word == "-o"]
    assert options == ["Port=2222", *BASE_OPTIONS]  # the user's first: ssh keeps the first
    assert "BatchMode=yes" in options and "ServerAliveInterval=5" in options
    # The remote command: gputop as the user wrote it (~ expands there), --demo passed on.
    assert argv[-2:] == ["a", "~/venv/bin/gputop --demo input-starved --gpus 0,1 "
                              "--interval 2 stream"]
    quoted = SshSettings(passthrough=("--demo", "x y")).gputop_command("capture", "12")
    assert quoted == "gputop --demo 'x y' capture 12"


def test_gputop_stream_writes_schema_1_lines():
    done = run_cli("--demo", "healthy", "--interval", "0.5", "stream", "--duration", "2.5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.encode().splitlines()
    first = decode_line(lines[0])
    assert isinstance(first, Hello) and first.schema == SCHEMA and first.demo == "healthy"
    samples = [decode_line(line) for line in lines[1:]]
    assert len(samples) >= 3 and all(isinstance(s, Sample) for s in samples)
    snap = samples[-1].snapshot
    assert [g.name for g in snap.gpus] == ["NVIDIA H100 80GB HBM3"] * 4
    assert snap.gpus[0].processes and snap.gpus[0].processes[0].workers
    assert snap.driver.simulated == "healthy"
    raw = json.loads(lines[-1])
    assert set(raw["snapshot"]) == {"time", "host", "driver", "gpus", "processes", "jobs"}


def test_stream_findings_of_the_node_arrive(spawn):
    proc = spawn([sys.executable, "-m", "gputop", "--demo", "gpu-lost", "--interval", "0.5",
                  "stream"], stdout=subprocess.PIPE, env=cli_env(), cwd=REPO)
    assert isinstance(decode_line(proc.stdout.readline().rstrip(b"\n")), Hello)
    deadline = time.monotonic() + SLOW
    ids: set[str] = set()
    lost = False
    while not ("hardware-errors" in ids and lost) and time.monotonic() < deadline:
        sample = decode_line(proc.stdout.readline().rstrip(b"\n"))
        ids |= {f.id for f in sample.findings}
        lost = lost or any(g.lost for g in sample.snapshot.gpus)
    assert "hardware-errors" in ids and lost
    proc.terminate()  # SIGTERM: the stream ends cleanly
    assert proc.wait(SLOW) == 0


def test_hostile_lines_are_refused_with_a_reason():
    good = sample_line(Snapshot(time=1.0, host=HostSample("h"), driver=DriverInfo(True)), [])
    assert isinstance(decode_line(good.rstrip(b"\n")), Sample)
    cases = {
        b"x" * (MAX_LINE + 1): "limit",
        b"not json": "not JSON",
        b'{"type": "sample"}': "missing required field",
        b'{"type": "hello", "schema": 99}': "schema 99",
        b'{"type": "sample", "time": 1, "snapshot": {"time": 1, "host": {"hostname": 5}, '
        b'"driver": {"available": true}}}': "Expected `str`",
        b'{"type": "sample", "time": 1, "snapshot": {"time": 1, "host": {"hostname": "h"}, '
        b'"driver": {"available": true}, "gpus": [{"index": 0}, {"index": 0}]}}': "twice",
        b'{"type": "sample", "time": 1, "snapshot": {"time": 1, "host": {"hostname": "h"}, '
        b'"driver": {"available": true}}, "findings": [{"id": "A B", "severity": "info"}]}':
            r"findings\[0\].id",
        b'{"type": "sample", "time": 1, "snapshot": {"time": 1, "host": {"hostname": "h"}, '
        b'"driver": {"available": true}}, "findings": [{"id": "x", "severity": "doom"}]}':
            r"findings\[0\].severity",
    }
    for line, why in cases.items():
        with pytest.raises(WireError, match=why):
            decode_line(line)
    # A newer node's finding id is kept (as escaped text), not a reason to drop the sample.
    newer = (b'{"type": "sample", "time": 1, "snapshot": {"time": 1, "host": {"hostname": '
             b'"h\\u001b[31m"}, "driver": {"available": true}}, "findings": [{"id": '
             b'"future-thing", "severity": "warning", "title": "t\\u202e"}]}')
    sample = decode_line(newer)
    assert sample.findings[0].id == "future-thing"
    assert sample.findings[0].title == "t\\u202e" and sample.snapshot.host.hostname == "h\\x1b[31m"
    error = decode_line(b'{"type": "error", "message": "NVML\\ngone"}')
    assert isinstance(error, StreamError) and error.message == "NVML gone"


def test_every_json_spelling_of_an_unsafe_character_arrives_escaped():
    """Each character safe_text escapes, written every way JSON can write it (raw UTF-8, a
    short escape, a \\u escape in either case), comes out escaped: the decoder's fast path
    that skips lines with nothing to escape must recognise them all."""
    from gputop.core.format import safe_text

    unsafe = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x200E, 0x200F,
                               *range(0x202A, 0x202F), *range(0x2066, 0x206A))]
    short = {"\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
    for ch in unsafe:
        spellings = {f"\\u{ord(ch):04x}", f"\\u{ord(ch):04X}"}
        if ch in short:
            spellings.add("\\" + short[ch])
        if ord(ch) >= 0x7F:
            spellings.add(ch)  # raw (JSON refuses raw C0 controls)
        for spelled in spellings:
            line = ('{"type": "hello", "schema": 1, "hostname": "a' + spelled + 'b"}').encode()
            hello = decode_line(line)
            assert hello.hostname == safe_text("a" + ch + "b") and hello.hostname.isprintable(), \
                (spelled, hello.hostname)


def view(host: str, state: str, **kw) -> NodeView:
    return NodeView(host=host, state=state, **kw)


def test_fleet_rows_one_per_gpu_and_one_for_a_node_that_is_down():
    snap = Snapshot(time=time.time(), host=HostSample("n1"), driver=DriverInfo(True),
                    gpus=(GpuSample(0, name="NVIDIA A100-SXM4-80GB", util_gpu=12.0,
                                    mem_used=1 << 30, mem_total=80 << 30, power_w=90.0,
                                    power_limit_w=400.0, temperature_c=50.0),
                          GpuSample(1, name="NVIDIA A100-SXM4-80GB", lost=True)))
    from gputop.fleet.wire import RemoteFinding

    finding = RemoteFinding("dataloader-stall", "critical", "GPU 0 starved", "e", "f", "n",
                            cost_s=7.0, gpu=0, pid=42)
    views = [view("n1", UP, snapshot=snap, findings=(finding,), seq=3),
             view("n2", DOWN, reason="ssh: connect to host n2 port 22: Connection refused",
                  retry_at=time.monotonic() + 8.2),
             view("n3", NO_GPUTOP, reason="sh: 1: exec: gputop: not found",
                  retry_at=time.monotonic() + 1),
             view("n4", SLOW_STATE, reason="no data for 9 s", snapshot=snap, seq=1)]
    rows = fleet_rows(views, 120)
    plain = [r.text.plain for r in rows]
    assert [r.key for r in rows] == [("n1", 0), ("n1", 1), ("n2", None), ("n3", None),
                                     ("n4", 0), ("n4", 1)]
    assert "A100-SXM4-80GB" in plain[0] and "12%" in plain[0] and "‼ dataloader-stall" in plain[0]
    assert "LOST" in plain[1]
    assert "DOWN: ssh: connect to host n2 port 22: Connection refused · retry in 8 s" in plain[2]
    assert "NO GPUTOP: sh: 1: exec: gputop: not found" in plain[3]
    assert "SLOW: no data for 9 s" in plain[4]
    assert all(len(p) <= 120 for p in plain)
    ranked = fleet_findings(views)
    assert [(f.host, f.id) for f in ranked] == [("n1", "dataloader-stall")]
    assert ranked[0].title == "n1: GPU 0 starved"


def test_option_errors_are_one_line(tmp_path):
    cases = [
        (["--hosts", "a", "snapshot"], "go with the live monitor and `watch`"),
        (["--hosts=-oProxyCommand=x", "watch"], "not a host name"),
        (["--hosts", "a", "--hostfile", "f", "watch"], "give one way"),
        (["--hosts", "a", "--ssh-config", str(tmp_path / "none"), "watch"], "no such file"),
        (["--hostfile", str(tmp_path / "none"), "watch"], "cannot read"),
        (["--slurm", "abc", "watch"], "job id"),
        (["--hosts", "a", "--ssh-option", "", "watch"], "--ssh-option"),
        (["--hosts", "a"], "needs a terminal"),
    ]
    if shutil.which("scontrol") is None:
        cases.append((["--slurm", "12345", "watch"], "needs Slurm's `scontrol`"))
    for argv, text in cases:
        done = run_cli(*argv, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, (argv, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], (argv, done.stderr)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6)
_REPLY_FIELDS = ["trace", "verdict", "error", "findings", "metrics", "file", "healthy_reason",
                 "assessed", "not_assessed"]
_FINDING_FIELDS = ["id", "severity", "title", "evidence", "fix", "next_step", "cost_s", "gpu",
                   "pid"]


@settings(max_examples=300, deadline=None)
@given(reply_field=st.sampled_from(_REPLY_FIELDS), finding_field=st.sampled_from(_FINDING_FIELDS),
       value=_json_values, other=_json_values)
def test_a_remote_capture_reply_of_any_shape_gives_the_documented_error_only(
        reply_field, finding_field, value, other):
    """`p` on a node: whatever JSON the node's `capture --json` prints, parse_reply returns a
    capture or raises RemoteCaptureError (one line), and the report of it lays out."""
    from gputop.fleet.capture import RemoteCapture, RemoteCaptureError, parse_reply, report_text

    finding = {"id": "dataloader-stall", "severity": "critical", "title": "t", "evidence": "e",
               "fix": "f", "next_step": "n", "cost_s": 1.0, "gpu": 0, "pid": 1}
    finding[finding_field] = value
    reply = {"trace": "/tmp/t.json", "verdict": "input-bound", "findings": [finding, other],
             "metrics": {}}
    reply[reply_field] = value if reply_field != "findings" else [finding, value]
    data = json.dumps(reply, allow_nan=True).encode()
    try:
        capture = parse_reply("node", 1, data)
    except RemoteCaptureError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(capture, RemoteCapture)
    text = report_text(capture, 100)
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]",
                         text), text
