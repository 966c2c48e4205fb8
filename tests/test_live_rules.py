"""gputop/diagnostics/live.py on scripted histories: each rule, no flapping, and clearing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputop.core.agent_status import parse_status
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot, WorkerSample
from gputop.diagnostics.live import LiveDiagnosis, evaluate

GIB = 1024**3
OWN = 999_999  # the monitor's pid in these histories


def gpu(index=0, util=97.0, **kw) -> GpuSample:
    base = dict(
        index=index, name="NVIDIA H100 80GB HBM3", util_gpu=util, mem_used=40 * GIB,
        mem_total=80 * GIB, power_w=600.0, power_limit_w=700.0, pcie_rx_mbs=1500.0,
        pcie_tx_mbs=100.0, pcie_gen=5, pcie_gen_max=5, pcie_width=16, pcie_width_max=16,
        sm_clock_mhz=1950.0, sm_clock_max_mhz=1980.0, temperature_c=65.0, ecc_volatile=0,
        processes=(proc(),),
    )
    base.update(kw)
    return GpuSample(**base)


def proc(pid=100, cpu=30.0, workers=(), ppid=1, agent=None, create_time=-3600.0,
         state=None) -> ProcSample:
    """A training process; by default one that started an hour before the history (past its
    start-up)."""
    return ProcSample(pid=pid, name="python", cpu_percent=cpu, gpu_mem=30 * GIB, ppid=ppid,
                      workers=tuple(WorkerSample(pid + 1 + i, "python", c, 1, "running")
                                    for i, c in enumerate(workers)), agent=agent,
                      create_time=create_time, state=state)


def snap(t: float, *gpus: GpuSample, host_cpu: float = 30.0) -> Snapshot:
    return Snapshot(t, HostSample("node", cpu_percent=host_cpu), DriverInfo(True), gpus or (gpu(),))


def history(make, seconds=30, step=1.0) -> list[Snapshot]:
    return [make(i * step) for i in range(int(seconds / step))]


def ids(findings) -> set[str]:
    return {f.id for f in findings}


def final(make, seconds=30) -> list:
    return evaluate(history(make, seconds), own_pid=OWN)


def test_healthy_history_has_no_findings():
    assert final(lambda t: snap(t, gpu(util=96 + (t % 3)))) == []


def test_dataloader_stall_from_saturated_workers():
    found = final(lambda t: snap(t, gpu(util=20, processes=(proc(cpu=5, workers=(97, 99, 95)),))))
    assert ids(found) == {"dataloader-stall"}
    f = found[0]
    assert f.gpu == 0 and f.pid == 100 and f.severity == "critical"
    assert "3 DataLoader workers" in f.evidence and "num_workers" in f.fix


def test_dataloader_stall_from_the_agent():
    agent = final(lambda t: snap(t, gpu(util=40, processes=(
        proc(cpu=40, agent=parse_status({"dataloader_wait_share": 0.6})),))))
    assert ids(agent) == {"dataloader-stall"} and "60%" in agent[0].evidence
    # The same severity scale as a capture: a 60% wait on a 60%-idle GPU is critical.
    assert agent[0].severity == "critical"


def test_a_cpu_bound_loop_without_workers_or_agent_is_host_bound():
    # Without the agent nothing tells loading in the loop (num_workers=0) from other Python:
    # the training thread is the bottleneck either way, and the finding says both.
    found = final(lambda t: snap(t, gpu(util=15, processes=(proc(cpu=99),))))
    assert ids(found) == {"host-bound"}
    f = found[0]
    assert f.severity == "critical" and f.pid == 100
    assert "no step breakdown" in f.evidence and "num_workers=0" in f.fix


def test_the_agents_direct_measure_wins_over_nvml():
    # NVML says 70% busy (any kernel running counts), the agent times the loop waiting 20% of
    # each step: a stall, at the cost the agent measured, and the evidence says so.
    waits = final(lambda t: snap(t, gpu(util=70, processes=(
        proc(cpu=40, agent=parse_status({"dataloader_wait_share": 0.2})),))))
    assert ids(waits) == {"dataloader-stall"} and waits[0].severity == "warning"
    assert "agent measures" in waits[0].evidence and "NVML" in waits[0].evidence
    # Saturated workers, but the agent says the loop does not wait: not an input stall.
    fed_loop = final(lambda t: snap(t, gpu(util=20, processes=(
        proc(cpu=5, workers=(97, 99), agent=parse_status({"dataloader_wait_share": 0.01})),))))
    assert "dataloader-stall" not in ids(fed_loop)


def test_one_root_cause_per_gpu_with_the_others_as_evidence():
    # Saturated workers on an idle-looking GPU: the input pipeline, not "waiting on I/O".
    def make(t):
        return snap(t, gpu(util=2, processes=(proc(cpu=1, workers=(97, 98)),)))

    found = final(make)
    assert [f.id for f in found] == ["dataloader-stall"]
    # Independent conditions are still reported beside the root cause.
    full = final(lambda t: snap(t, gpu(util=2, mem_used=int(78 * GIB),
                                       processes=(proc(cpu=1, workers=(97, 98)),))))
    assert ids(full) == {"dataloader-stall", "memory-pressure"}


def test_a_cpu_starved_process_is_not_idle_waiting_on_io():
    def make(t):  # the tree gets no CPU on a saturated host, but is runnable all the time
        return snap(t, gpu(util=2, processes=(proc(cpu=3, workers=(4, 3)),)), host_cpu=100.0)

    assert "gpu-idle" not in ids(final(make))


def test_low_utilization_with_idle_workers_is_not_a_stall():
    assert "dataloader-stall" not in ids(final(
        lambda t: snap(t, gpu(util=20, processes=(proc(cpu=5, workers=(3, 2)),)))))


def sawtooth(t: float) -> float:
    phase = (t % 2.6) / 2.6
    return 40 + 58 * phase / 0.75 if phase < 0.75 else 3


def test_a_sawtooth_alone_is_not_host_sync():
    # Start-up and any uneven job make this shape: without evidence that the host waits on
    # the device it is not a sync (a CPU-bound loop is the host's own work).
    found = final(lambda t: snap(t, gpu(util=sawtooth(t), processes=(proc(cpu=95),))))
    assert "host-sync" not in ids(found)
    assert "host-sync" not in ids(final(lambda t: snap(t, gpu(
        util=sawtooth(t), processes=(proc(cpu=10),)))))


def test_host_sync_from_the_agents_sync_timing():
    def make(sync):
        return lambda t: snap(t, gpu(util=60, sm_active=50.0, processes=(proc(cpu=90, agent=parse_status({
            "steps": 100 + int(t), "dataloader_wait_share": 0.0, "sync_wait_share": sync,
            "host_busy_share": 0.4})),)))

    found = final(make(0.5))
    assert ids(found) == {"host-sync"} and found[0].severity == "critical"
    assert "50% of each step" in found[0].evidence and ".item()" in found[0].fix
    assert "host-sync" not in ids(final(make(0.02)))  # a sync that costs nothing


def test_host_sync_from_a_process_asleep_while_its_gpu_works():
    def make(t):  # a blocking sync at slow steps: asleep while the GPU works, else running
        busy = (t % 3) < 2
        return snap(t, gpu(util=95 if busy else 2, processes=(
            proc(cpu=40, state="sleeping" if busy else "running"),)))

    found = final(make)
    assert ids(found) == {"host-sync"}
    assert "take turns" in found[0].evidence


def test_host_bound_from_the_agents_step_breakdown():
    def make(busy, cpu):
        return lambda t: snap(t, gpu(util=20, sm_active=17.0, processes=(proc(cpu=cpu, agent=parse_status({
            "steps": 100 + int(t), "dataloader_wait_share": 0.0, "sync_wait_share": 0.0,
            "host_busy_share": busy})),)))

    found = final(make(0.95, 100))
    assert ids(found) == {"host-bound"} and found[0].severity == "critical"
    assert "95% of each step" in found[0].evidence and "not tiny" in found[0].evidence
    # A loop that sleeps between steps (the leak job: 50 ms of sleep per step) idles the GPU
    # but is not busy: not host-bound.
    assert "host-bound" not in ids(final(make(0.1, 15)))


def test_tiny_kernels_are_launch_bound_not_host_bound():
    # 40 tiny layers on an H200: utilization 15-21 %, SM activity < 1 %, the thread saturated.
    found = final(lambda t: snap(t, gpu(util=18, sm_active=0.8, pcie_rx_mbs=5.0,
                                        processes=(proc(cpu=99),))))
    assert ids(found) == {"launch-bound"} and found[0].severity == "critical"
    assert "cannot launch faster" in found[0].evidence
    # The same loop on a GPU without GPM: the host is the bottleneck, and the finding says
    # launches cannot be told from Python there.
    no_gpm = final(lambda t: snap(t, gpu(util=18, pcie_rx_mbs=5.0, processes=(proc(cpu=99),))))
    assert ids(no_gpm) == {"host-bound"} and "no SM activity" in no_gpm[0].evidence


def test_no_cause_during_start_up():
    # With the agent: until the first optimizer step, whatever the GPU and CPU read.
    def with_agent(first_step):
        return lambda t: snap(t, gpu(util=0, mem_used=GIB // 2, processes=(proc(
            cpu=100, create_time=0.0,
            agent=parse_status({"steps": max(0, int(t - first_step)), "dataloader_wait_share": 0.0})),)))

    assert final(with_agent(100), 25) == []
    after = final(with_agent(5), 25)  # stepping since 5 s, GPU still idle, thread saturated
    assert ids(after) == {"host-bound"}

    # Without the agent: until its GPU first works (or it is STARTUP_MAX_S old).
    def young(t):
        return snap(t, gpu(util=0 if t < 20 else 15,
                           processes=(proc(cpu=99, create_time=0.0),)))

    assert final(young, 20) == []
    assert ids(final(young, 28)) == {"host-bound"}
    # A process that never works is judged once it is too old to be starting.
    idle = lambda t: snap(t, gpu(util=0, processes=(proc(cpu=1, create_time=0.0),)))  # noqa: E731
    assert final(idle, 25) == []
    assert ids(final(idle, 45)) == {"gpu-idle"}


def test_memory_growth_leaves_the_start_up_out():
    # The allocator's first fill during start-up is not a leak; the fit starts at step 1.
    def make(t):
        steps = max(0, int(t) - 10)
        mem = (t * 2 * GIB) if t < 10 else 20 * GIB
        return snap(t, gpu(mem_used=int(mem), processes=(proc(
            create_time=0.0, agent=parse_status({"steps": steps, "dataloader_wait_share": 0.0})),)))

    assert "memory-growth" not in ids(final(make, 40))


def test_gpu_idle_then_hung():
    idle = lambda t: snap(t, gpu(util=0, processes=(proc(cpu=1),)))  # noqa: E731
    assert ids(final(idle, 20)) == {"gpu-idle"}
    # Both hold after 60 s; one GPU gets one root cause, the more specific (hung), and names
    # the other in its evidence.
    hung = final(idle, 70)
    assert ids(hung) == {"hung"} and "gpu-idle" in hung[0].evidence
    # Steps advancing (agent) means slow, not hung.
    moving = lambda t: snap(t, gpu(util=0, processes=(  # noqa: E731
        proc(cpu=1, agent=parse_status({"steps": int(t)})),)))
    assert "hung" not in ids(final(moving, 70))


def test_free_gpu_is_not_idle():
    assert final(lambda t: snap(t, gpu(util=0, mem_used=GIB // 2, processes=()))) == []


def test_throttling_needs_busy_gpu_and_lost_clock():
    capped = lambda t: snap(t, gpu(util=99, clock_events=("sw_power_cap",), sm_clock_mhz=1400.0))  # noqa: E731
    found = final(capped)
    assert ids(found) == {"throttling"} and found[0].severity == "warning"
    assert "-29%" in found[0].evidence
    thermal = final(lambda t: snap(t, gpu(util=99, clock_events=("hw_thermal",), sm_clock_mhz=1000.0)))
    assert thermal[0].severity == "critical"
    # Capped but idle, or capped at full clock: costs nothing.
    assert final(lambda t: snap(t, gpu(util=5, clock_events=("sw_power_cap",), sm_clock_mhz=1400.0))) == []
    assert final(lambda t: snap(t, gpu(util=99, clock_events=("sw_power_cap",)))) == []


def test_memory_pressure_and_growth_with_time_to_oom():
    full = final(lambda t: snap(t, gpu(mem_used=int(78 * GIB))))
    assert ids(full) == {"memory-pressure"}
    leak = final(lambda t: snap(t, gpu(mem_used=int(20 * GIB + t * 0.2 * GIB))), seconds=70)
    assert ids(leak) == {"memory-growth"}
    assert "out of memory in" in leak[0].evidence and leak[0].severity == "critical"
    # The same rise seen for only 20 s: raised (the README's 10 s minimum), but a warning
    # until it has held a minute, and the evidence says how much history the fit used.
    young = final(lambda t: snap(t, gpu(mem_used=int(20 * GIB + t * 0.2 * GIB))), seconds=20)
    assert ids(young) == {"memory-growth"} and young[0].severity == "warning"
    assert "19 s of history so far" in young[0].evidence
    # Too few samples for a trend (eight are needed, over 5 s).
    assert final(lambda t: snap(t, gpu(mem_used=int(20 * GIB + t * 0.2 * GIB))), 6) == []
    # Noise around a plateau is not growth.
    flat = final(lambda t: snap(t, gpu(mem_used=int(40 * GIB + ((t * 7) % 5) * 0.1 * GIB))), 60)
    assert "memory-growth" not in ids(flat)


def test_pcie_bound():
    found = final(lambda t: snap(t, gpu(util=40, pcie_rx_mbs=45000.0)))
    assert ids(found) == {"pcie-bound"} and "Gen5 x16" in found[0].evidence


def test_pcie_bound_whatever_utilization_says():
    # A copy loop on an H200: utilization counts the copies (52-100 %), SM activity 3-7 %.
    copies = final(lambda t: snap(t, gpu(util=90, sm_active=5.0, pcie_rx_mbs=45000.0,
                                         processes=(proc(cpu=99),))))
    assert [f.id for f in copies] == ["pcie-bound"] and copies[0].severity == "critical"
    # Compute longer than the copies: they can hide under it.
    assert final(lambda t: snap(t, gpu(util=99, sm_active=85.0, pcie_rx_mbs=45000.0))) == []
    assert final(lambda t: snap(t, gpu(util=40, pcie_rx_mbs=9000.0))) == []


def test_pcie_link_from_the_datasheet_when_the_driver_lacks_it():
    bare = dict(pcie_gen=None, pcie_gen_max=None, pcie_width=None, pcie_width_max=None)
    h200 = final(lambda t: snap(t, gpu(name="NVIDIA H200", util=40, pcie_rx_mbs=45000.0,
                                       **bare)))
    assert ids(h200) == {"pcie-bound"} and "H200 Tensor Core GPU datasheet" in h200[0].evidence
    unknown = final(lambda t: snap(t, gpu(name="Some GPU", util=40, pcie_rx_mbs=45000.0, **bare)))
    assert "pcie-bound" not in ids(unknown)


def test_contention_and_imbalance():
    shared = final(lambda t: snap(t, gpu(processes=(proc(100), proc(200)))))
    assert ids(shared) == {"contention"}

    def job(t):  # two ranks of one torchrun (ppid 50), one a straggler
        return snap(t, gpu(0, util=95, processes=(proc(100, ppid=50),)),
                    gpu(1, util=40, processes=(proc(200, ppid=50),)))

    found = final(job)
    assert "imbalance" in ids(found)
    assert next(f for f in found if f.id == "imbalance").gpu == 1

    def separate(t):  # the same numbers in two unrelated jobs: not imbalance
        return snap(t, gpu(0, util=95, processes=(proc(100, ppid=OWN),)),
                    gpu(1, util=40, processes=(proc(200, ppid=OWN),)))

    assert "imbalance" not in ids(final(separate))


def test_hardware_errors_lost_gpu_and_ecc():
    lost = final(lambda t: snap(t, gpu(0), GpuSample(index=1, name="A100", lost=True)))
    assert ids(lost) == {"hardware-errors"} and lost[0].gpu == 1
    ecc = final(lambda t: snap(t, gpu(ecc_volatile=int(t))))
    assert ids(ecc) == {"hardware-errors"}


def test_launch_bound_from_gpm():
    # Kernels running all the time but on a few SMs each: per DCGM's definition a kernel of
    # N/k blocks reads SM activity 1/k.
    found = final(lambda t: snap(t, gpu(util=95, sm_active=5.0)))
    assert ids(found) == {"launch-bound"} and "torch.compile" in found[0].fix
    assert final(lambda t: snap(t, gpu(util=95, sm_active=80.0))) == []
    # A fifth of the SMs, the GPU fed all the time: small kernels, not the launch path.
    assert final(lambda t: snap(t, gpu(util=95, sm_active=18.0))) == []


# -- hysteresis ------------------------------------------------------------------------------------


def feed(diag: LiveDiagnosis, snaps) -> list:
    out = []
    for s in snaps:
        out.extend(diag.update(s))
    return out


def starved(t):
    return snap(t, gpu(util=15, processes=(proc(cpu=5, workers=(98, 97)),)))


def fed(t):
    return snap(t, gpu(util=97, processes=(proc(cpu=30, workers=(20, 20)),)))


def test_raises_after_holding_and_clears_after_absence():
    diag = LiveDiagnosis(raise_after=4, clear_after=10, own_pid=OWN)
    trans = feed(diag, [starved(t) for t in range(20)])
    assert [(t.state, t.finding.id) for t in trans] == [("raised", "dataloader-stall")]
    # Window needs 3 samples, then the condition must hold 4 s.
    assert 5 <= trans[0].time <= 8
    assert [f.id for f in diag.findings()] == ["dataloader-stall"]
    trans = feed(diag, [fed(t) for t in range(20, 45)])
    assert [(t.state, t.finding.id) for t in trans] == [("cleared", "dataloader-stall")]
    assert diag.findings() == []


@pytest.mark.parametrize("period", [2, 6])
def test_no_flapping_on_an_intermittent_condition(period):
    """A condition that comes and goes faster than the hysteresis never raises and clears in a loop."""
    diag = LiveDiagnosis(raise_after=4, clear_after=10, own_pid=OWN)
    snaps = [(starved if (t // period) % 2 == 0 else fed)(t) for t in range(200)]
    trans = feed(diag, snaps)
    raised = [t for t in trans if t.state == "raised"]
    cleared = [t for t in trans if t.state == "cleared"]
    assert len(raised) <= 1 and len(cleared) <= 1


def test_a_short_blip_does_not_raise():
    diag = LiveDiagnosis(raise_after=4, clear_after=10, own_pid=OWN)
    snaps = [fed(t) for t in range(15)] + [replace(starved(t)) for t in range(15, 17)]
    snaps += [fed(t) for t in range(17, 40)]
    assert feed(diag, snaps) == []


def test_transition_json_has_the_public_keys():
    diag = LiveDiagnosis(raise_after=0, own_pid=OWN)
    trans = feed(diag, [starved(t) for t in range(6)])
    data = trans[0].to_json("node")
    assert set(data) >= {"time", "host", "gpu", "pid", "id", "severity", "evidence", "fix", "state"}
    assert data["state"] == "raised" and data["host"] == "node"


def test_a_new_root_cause_replaces_the_old_one_in_the_same_tick():
    def idle(t):  # held but idle, nothing running on the host
        return snap(t, gpu(util=1, processes=(proc(cpu=1),)))

    def loader_bound(t):  # then the workers saturate: the input pipeline explains it
        return snap(t, gpu(util=1, processes=(proc(cpu=1, workers=(97, 98)),)))

    diag = LiveDiagnosis(raise_after=4, clear_after=10, own_pid=OWN)
    seen = []
    for s in [idle(t) for t in range(20)] + [loader_bound(t) for t in range(20, 45)]:
        trans = diag.update(s)
        seen.extend((t.state, t.finding.id, s.time) for t in trans)
        assert len([f for f in diag.findings() if f.gpu == 0]) <= 1, diag.findings()
    raised_idle = [x for x in seen if x[:2] == ("raised", "gpu-idle")]
    raised_loader = [x for x in seen if x[:2] == ("raised", "dataloader-stall")]
    cleared_idle = [x for x in seen if x[:2] == ("cleared", "gpu-idle")]
    assert raised_idle and raised_loader and cleared_idle
    assert cleared_idle[0][2] == raised_loader[0][2]  # the switch happens in one tick


def test_the_costliest_host_cause_wins():
    # A per-step .item() that waits 5 % of the step, on a GPU idle 78 % behind a thread busy
    # with its own Python (H200: util 21 %, SM 12 %): host-bound explains the idle time, and
    # names the sync in its evidence.
    found = final(lambda t: snap(t, gpu(util=22, sm_active=12.0, processes=(proc(cpu=99, agent=parse_status({
        "steps": 100 + int(t), "dataloader_wait_share": 0.0, "sync_wait_share": 0.06,
        "host_busy_share": 0.9})),))))
    assert [f.id for f in found] == ["host-bound"]
    assert "host-sync" in found[0].evidence
