"""The memory capture's arithmetic and judgement, on events and reports built to the documented
formats: growth net of what a step re-makes, the peak's parts, the CUDA allocator's trace
entries (torch.cuda.memory._snapshot()'s TraceEntry) as events, the fragmentation rule, the
findings' "where". The real instruments are exercised by test_memory_capture.py."""

from __future__ import annotations

import msgspec
import pytest

from gputop.agent.memory.events import Sites, allocator_events, user_site
from gputop.agent.memory.summary import Storages, growth, peak
from gputop.capture.memory.report import ReportError, decode_report
from gputop.capture.memory.verdict import verdicts
from gputop.capture.memory.where import MemoryWhere
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot
from gputop.diagnostics.findings import Finding

MIB = 1 << 20
MS = 1_000_000  # events are in ns
MARKS = [0, 100 * MS, 200 * MS, 300 * MS, 400 * MS]  # warm-up, then 3 steps


def test_a_steady_leak_grows_and_remade_gradients_do_not():
    events = []
    for step in range(4):
        t = step * 100 * MS
        # Gradients: freed at zero_grad, made again in backward, at the same line.
        if step:
            events.append((t + 1 * MS, 1000 + step - 1, -4 * MIB, -1))
        events.append((t + 50 * MS, 1000 + step, 4 * MIB, 1))
        # The leak: a new tensor kept every step.
        events.append((t + 60 * MS, 2000 + step, MIB, 2))
        # An activation, freed in the same step.
        events.append((t + 10 * MS, 3000, 8 * MIB, 3))
        events.append((t + 40 * MS, 3000, -8 * MIB, -1))
    lines, newest = growth(sorted(events), MARKS)
    assert [x["site"] for x in lines] == [2]
    leak = lines[0]
    assert leak["bytes"] == 3 * MIB and leak["bytes_per_step"] == MIB and leak["count"] == 3
    assert leak["alive_per_step"] == [MIB, 2 * MIB, 3 * MIB, 4 * MIB] and leak["steady"]
    assert newest == {2: 2003}


def test_a_one_off_is_growth_but_not_steady():
    events = [(150 * MS, 1, 2 * MIB, 7)]
    (line,), _ = growth(events, MARKS)
    assert line["bytes"] == 2 * MIB and line["steady"] is False


def test_the_peak_has_the_models_parts_activations_and_what_the_step_kept():
    storages = Storages(parameters={10: 3 * MIB}, gradients={20: 3 * MIB},
                        optimizer_state={30: 6 * MIB})
    events = []
    for step in range(4):
        t = step * 100 * MS
        events.append((t + 10 * MS, 40 + step, 16 * MIB, 1))  # forward: saved for backward
        events.append((t + 20 * MS, 50 + step, MIB, 2))  # kept: never freed
        if step:
            events.append((t + 1 * MS, 20, -3 * MIB, -1))  # zero_grad(set_to_none)
        events.append((t + 30 * MS, 20, 3 * MIB, 3))  # backward makes the gradient
        events.append((t + 40 * MS, 40 + step, -16 * MIB, -1))
    p = peak(sorted(events), MARKS, storages, baseline=None)
    assert p["step"] in (1, 2, 3) and not p["absolute"]
    parts = p["parts"]
    assert parts["parameters"] == 3 * MIB and parts["optimizer_state"] == 6 * MIB
    assert parts["activations"] == 16 * MIB
    assert parts["gradients"] == 3 * MIB  # made before the forward freed its activations
    assert parts["other"] == (p["step"] + 1) * MIB  # what the steps kept so far
    assert p["activation_lines"] == [{"site": 1, "bytes": 16 * MIB}]
    # With the allocator's count (CUDA), what was held before the window is "other" too.
    absolute = peak(sorted(events), MARKS, storages, baseline=100 * MIB)
    assert absolute["absolute"] and absolute["bytes"] == sum(absolute["parts"].values())
    assert absolute["parts"]["other"] > parts["other"]


def test_the_allocators_trace_entries_become_events_charged_to_the_users_line():
    def frames(*files):
        return [{"filename": f, "line": n, "name": fn} for f, n, fn in files]

    user = ("/home/me/train.py", 42, "step")
    library = ("/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward")
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 20 * MIB, "time_us": 900},
        {"action": "alloc", "addr": 1, "size": MIB, "time_us": 1000,
         "frames": frames(library, user)},  # innermost first
        {"action": "alloc", "addr": 2, "size": MIB, "time_us": 1100, "frames": []},
        {"action": "free_requested", "addr": 2, "size": MIB, "time_us": 1200},
        {"action": "free_completed", "addr": 2, "size": MIB, "time_us": 1201},
        {"action": "free_completed", "addr": 3, "size": MIB, "time_us": 1300},  # asked earlier
        {"action": "alloc", "addr": 4, "size": MIB, "time_us": 99_000},  # after the window
    ]
    sites = Sites()
    read = allocator_events(trace, sites, since_ns=500_000, until_ns=2_000_000)
    assert [e[2] for e in read.events] == [MIB, MIB, -MIB, -MIB]
    assert read.events[0][3] == 0 and sites.sites[0].file == user[0]
    assert read.events[1][3] == -1  # no Python frame
    assert read.reserved_deltas == [(900_000, 20 * MIB)]
    assert read.first_entry_ns == 900_000 and read.entries == len(trace)
    assert user_site([library]) is None


def report(**fields) -> dict:
    base = {"format": "gputop-memory", "version": 1, "kind": "capture", "pid": 7, "time": 1.0,
            "device": "cuda:0", "source": "allocator-history"}
    return {**base, **fields}


def decoded(**fields):
    return decode_report(msgspec.json.encode(report(**fields)))


ALLOC = {"reserved": 10 << 30, "allocated": 6 << 30, "inactive_split": 3 << 30,
         "segments": {"count": 40, "largest_free": 512 * MIB, "free": 4 << 30}}


def ids(r) -> list[str]:
    return [v.id for v in verdicts(r)]


def test_fragmentation_is_named_when_it_is_the_cause_with_the_setting_that_addresses_it():
    # An OOM asking for less than was reserved but unallocated: the memory was in pieces.
    oom = {"requested": 2 << 30, "message": "CUDA out of memory", "step": 9}
    r = decoded(kind="oom", oom=oom, allocator=ALLOC, source="allocator-state")
    (v,) = [v for v in verdicts(r) if v.id == "fragmentation"]
    assert "expandable_segments:True" in v.fix and "largest free block: 512 MiB" in v.text
    # Already on: the other setting.
    r = decoded(kind="oom", oom=oom, source="allocator-state",
                allocator={**ALLOC, "expandable_segments": True})
    assert "max_split_size_mb" in verdicts(r)[0].fix
    # Asking for more than that: the memory was in use.
    r = decoded(kind="oom", oom={**oom, "requested": 5 << 30}, allocator=ALLOC,
                source="allocator-state")
    assert ids(r) == ["in-use"]
    # Without a failure: 30 % of reserved non-releasable is fragmentation, 10 % is a cache.
    assert ids(decoded(allocator=ALLOC)) == ["fragmentation"]
    assert ids(decoded(allocator={**ALLOC, "inactive_split": 1 << 30})) == ["cache"]
    assert "retries" in ids(decoded(allocator={**ALLOC, "alloc_retries": 3}))
    assert ids(decoded(device="cpu", source="profiler",
                       allocator={"caching": False})) == ["cpu-allocator"]


def test_reports_are_refused_when_wrong_or_over_their_bounds():
    with pytest.raises(ReportError, match="not a gputop memory report"):
        decode_report(b'{"format": "gputop-memory"}')
    with pytest.raises(ReportError):
        decoded(growth=[{"bytes": 1, "bytes_per_step": 1}] * 17)
    with pytest.raises(ReportError):
        decoded(device="cuda:0; rm -rf")
    with pytest.raises(ReportError, match="without its error"):
        decoded(kind="oom")
    assert decoded(newer_field={"x": 1}).pid == 7  # a newer agent's fields are ignored


def _snap(pid: int) -> Snapshot:
    gpu = GpuSample(index=0, uuid="GPU-0", name="H100", processes=(ProcSample(pid, "python"),))
    return Snapshot(time=1.0, host=HostSample(hostname="h"), driver=DriverInfo(True),
                    gpus=(gpu,))


def test_after_a_memory_capture_the_memory_findings_name_the_line_that_grows():
    where = MemoryWhere()
    growth_finding = Finding(id="memory-growth", severity="warning", title="t", evidence="e",
                             fix="f", next_step="gputop memory 4242 --steps 3", gpu=0)
    other = Finding(id="gpu-idle", severity="warning", title="t", evidence="e", fix="f",
                    next_step="n", gpu=0)
    assert where.enrich([growth_finding], _snap(4242)) == (growth_finding,)
    where.note(decoded(pid=4242, steps=3, growth=[{
        "file": "/x/train.py", "line": 31, "function": "keep", "bytes": 3 * MIB,
        "bytes_per_step": MIB}]))
    found, untouched = where.enrich([growth_finding, other], _snap(4242))
    assert found.where.startswith("train.py:31 keep keeps +1.00 MiB per step")
    assert untouched.where is None
    assert where.enrich([growth_finding], _snap(1))[0].where is None  # another process


def test_peak_advice_scales_with_what_is_at_stake():
    """Issue 38: no activation checkpointing for a 3.5 MiB peak; a hint while the device has
    room; the full fix when the peak nears the device's memory."""
    def advice(peak_bytes: int, total: int | None) -> str:
        parts = {"activations": peak_bytes, "parameters": 0, "gradients": 0,
                 "optimizer_state": 0, "other": 0}
        r = decoded(peak={"step": 3, "bytes": peak_bytes, "parts": parts},
                    allocator={"device_total": total} if total else {})
        (v,) = [v for v in verdicts(r) if v.id == "activations"]
        return v.fix

    small = advice(int(3.5 * MIB), None)
    assert small.startswith("nothing to do: a 3.50 MiB peak is small")
    roomy = advice(20 << 30, 80 << 30)
    assert roomy.startswith("the peak is 25% of the device's 80.0 GiB: room to spare")
    full = advice(70 << 30, 80 << 30)
    assert full.startswith("activation checkpointing")
