"""The pure parts of issue 30 on given inputs: the datasheet table, the goodput ledger's
bookkeeping, MFU and its GPM cross-check, J/step over the energy window, jobs, the mfu-drop
rule. (The same code on real jobs: tests/test_efficiency.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputop.agent.goodput import HANG_S, LONG_STEP_MIN_S, REGIME_STEPS, GoodputLedger
from gputop.core.agent_status import parse_status
from gputop.core.efficiency import (
    EfficiencyTracker,
    efficiency,
    job_figures,
    share_text,
    short_text,
)
from gputop.core.model import Efficiency, GpuSample, ProcSample
from gputop.core.peaks import BOARDS, PRECISIONS, board_of, peak_for
from gputop.diagnostics.live import evaluate
from tests.test_live_rules import OWN, gpu, proc, snap

# What NVML (and amd-smi) call the boards, and the table's entry each must find.
NAMES = {
    "Tesla V100-SXM2-16GB": "V100 SXM2", "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla V100-PCIE-16GB": "V100 PCIe", "Tesla V100S-PCIE-32GB": "V100S PCIe",
    "Tesla T4": "T4", "NVIDIA A100-SXM4-40GB": "A100", "NVIDIA A100-SXM4-80GB": "A100",
    "NVIDIA A100-PCIE-40GB": "A100", "NVIDIA A100 80GB PCIe": "A100", "NVIDIA A10": "A10",
    "NVIDIA A10G": None, "NVIDIA A30": "A30", "NVIDIA A40": "A40", "NVIDIA L4": "L4",
    "NVIDIA L40": "L40", "NVIDIA L40S": "L40S", "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": "H100 NVL", "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL", "NVIDIA GH200 480GB": "GH200", "NVIDIA B200": "B200",
    "AMD Instinct MI210": "MI210", "AMD Instinct MI250X": "MI250X",
    "AMD Instinct MI250X/MI250": "MI250X", "AMD Instinct MI250": "MI250",
    "AMD Instinct MI300A": "MI300A", "AMD Instinct MI300X": "MI300X", "Tesla K80": None,
}


@pytest.mark.parametrize("name,board", sorted(NAMES.items()))
def test_device_names_find_their_datasheet(name, board):
    found = board_of(name)
    assert (found.name if found else None) == board


def test_every_entry_is_dense_and_sourced():
    for board in BOARDS:
        assert set(board.tflops) <= set(PRECISIONS) and board.tflops
        assert "datasheet" in board.source or "specifications" in board.source \
            or "brochure" in board.source, board
        assert "https://" in board.source
        # Dense: never above the precision one step coarser (sparse figures double).
        if "bf16" in board.tflops and "fp8" in board.tflops:
            assert board.tflops["fp8"] == pytest.approx(2 * board.tflops["bf16"], rel=0.03)
    assert peak_for("NVIDIA H100 80GB HBM3", "bf16").flops == 989.5e12  # 1,979 sparse / 2
    assert peak_for("NVIDIA A100-SXM4-80GB", "tf32").flops == 156e12
    assert peak_for("AMD Instinct MI300X", "bf16").flops == 1307.4e12
    assert peak_for("NVIDIA B200", "bf16").flops == 2250e12
    # No bf16 on a V100: unknown, not a guess; TF32 falls back to fp32 where there is none.
    assert peak_for("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_for("Tesla V100-SXM2-16GB", "tf32").precision == "fp32"
    assert peak_for("Tesla K80", "fp32") is None and peak_for(None, "fp32") is None


def agent(flops=1e12, rate=2.0, precision="bf16", samples=32, steps=100, best=None,
          goodput=0.8, state="idle", ok=True):
    last = {"ok": ok, "flops_per_step": flops, "precision": precision,
            "samples_per_step": samples} if ok is not None else None
    return parse_status({"steps": steps, "steps_per_s": rate,
                         "flops": {"state": state, **({"last": last} if last else {})},
                         "goodput": {"goodput": goodput, "best_window_steps_per_s": best,
                                     "seconds": {"productive": 80.0, "startup": 20.0}}})


H100 = dict(index=0, name="NVIDIA H100 80GB HBM3", sm_clock_mhz=1980.0, sm_clock_max_mhz=1980.0)


def test_mfu_is_counted_flops_at_the_measured_rate_over_the_peak():
    eff = efficiency(agent(flops=1e12, rate=2.0, best=3.0), GpuSample(**H100, tensor_active=22))
    assert eff.achieved_flops == 2e12 and eff.peak_flops == 989.5e12
    assert eff.mfu == pytest.approx(2e12 / 989.5e12)
    assert eff.best_mfu == pytest.approx(3e12 / 989.5e12)
    assert eff.tensor_agrees is False  # pipes 22 % busy, the count fills 0.2 %
    assert eff.goodput == 0.8 and eff.goodput_s == {"productive": 80.0, "startup": 20.0}
    # A count the hardware could not do: more than the tensor pipes were busy for.
    over = efficiency(agent(flops=200e12, rate=2.0), GpuSample(**H100, tensor_active=10))
    assert over.tensor_agrees is False and "the FLOP count or the peak is off" in over.tensor_note
    fits = efficiency(agent(flops=200e12, rate=2.0), GpuSample(**H100, tensor_active=50))
    assert fits.tensor_agrees is True
    # fp32 does not run on tensor cores: not comparable; no GPM: no check at all.
    fp32 = efficiency(agent(precision="fp32"), GpuSample(**H100, tensor_active=50))
    assert fp32.tensor_agrees is None and "tensor cores" in fp32.tensor_note
    assert efficiency(agent(), GpuSample(**H100)).tensor_note is None


def test_without_a_peak_the_reason_and_the_achieved_rate():
    cases = [(GpuSample(index=0, name="Tesla K80"), "no datasheet peak for Tesla K80"),
             (GpuSample(index=0, name="Tesla V100-SXM2-16GB"), "has no bf16 peak"),
             (None, "not on a GPU")]
    for gpu_sample, why in cases:
        eff = efficiency(agent(), gpu_sample)
        assert eff.mfu is None and why in eff.mfu_note and eff.achieved_flops == 2e12
    pending = efficiency(agent(ok=None, state="armed"), GpuSample(**H100))
    assert pending.mfu is None and "not counted yet" in pending.mfu_note
    failed = efficiency(parse_status({"flops": {"state": "idle", "last": {
        "ok": False, "message": "boom"}}}), GpuSample(**H100))
    assert "boom" in failed.mfu_note
    assert short_text(pending) == "goodput 80%"  # no MFU yet: left out of the narrow row


def test_hostile_agent_numbers_are_dropped():
    for bad in ({"flops": {"last": {"ok": True, "flops_per_step": float("inf")}}},
                {"flops": {"last": {"ok": True, "flops_per_step": -5}}},
                {"flops": {"last": {"ok": True, "flops_per_step": True}}},
                {"flops": "x", "goodput": {"goodput": 7, "seconds": {"productive": "a"}}}):
        eff = efficiency(parse_status(bad), GpuSample(**H100))
        assert eff.mfu is None and eff.goodput is None and eff.goodput_s == {}
    odd = agent(precision="\x1b[31mred")
    assert efficiency(odd, GpuSample(**H100)).precision is None


def test_energy_per_step_over_the_window():
    tracker = EfficiencyTracker(window_s=30.0)

    def tick(t, joules, steps, index=0):
        g = GpuSample(**{**H100, "index": index}, energy_j=joules)
        return tracker.update(t, {7: [(g, 1 << 30)]}, {7: agent(steps=steps)})[7]

    assert tick(0.0, 1000.0, 10).j_per_step is None  # one point: no rate yet
    eff = tick(1.0, 1500.0, 12)
    assert eff.j_per_step == 250.0 and eff.energy_window_s == 1.0
    assert eff.j_per_sample == 250.0 / 32
    for t in range(2, 40):
        eff = tick(float(t), 1500.0 + 100.0 * (t - 1), 12 + (t - 1))
    assert eff.j_per_step == pytest.approx(100.0) and eff.energy_window_s <= 31
    # A counter that went back (driver reload) or another GPU: start again.
    assert tick(41.0, 10.0, 60).j_per_step is None
    assert tick(42.0, 5000.0, 61, index=1).j_per_step is None


def test_a_tick_without_the_agents_reply_keeps_the_energy_window():
    """A busy process's agent misses a tick's deadline (the probe asks it again later): its
    J/step still spans the ticks around the gap; a pid silent for a whole window is forgotten."""
    tracker = EfficiencyTracker(window_s=30.0)
    g = GpuSample(**H100, energy_j=1000.0)
    tracker.update(0.0, {7: [(g, 1 << 30)]}, {7: agent(steps=10)})
    assert tracker.update(1.0, {7: [(g, 1 << 30)]}, {}) == {}  # no reply this tick
    later = GpuSample(**H100, energy_j=1600.0)
    eff = tracker.update(2.0, {7: [(later, 1 << 30)]}, {7: agent(steps=13)})[7]
    assert eff.j_per_step == 200.0 and eff.energy_window_s == 2.0
    tracker.update(40.0, {}, {})  # silent for more than the window: forgotten
    assert tracker.update(41.0, {7: [(later, 1 << 30)]}, {7: agent(steps=14)})[7].j_per_step \
        is None


def test_a_process_is_on_the_gpu_where_it_holds_most_memory():
    tracker = EfficiencyTracker()
    small = GpuSample(index=0, name="NVIDIA A100-SXM4-80GB")
    big = GpuSample(**{**H100, "index": 1})
    eff = tracker.update(0.0, {7: [(small, 500 << 20), (big, 60 << 30)]}, {7: agent()})[7]
    assert eff.device == "H100 SXM"


def test_jobs_sum_peaks_and_energy_over_their_ranks():
    a = Efficiency(mfu=0.4, achieved_flops=400.0, peak_flops=1000.0, goodput=0.9, j_per_step=5.0)
    b = Efficiency(mfu=0.2, achieved_flops=200.0, peak_flops=1000.0, goodput=0.7, j_per_step=6.0)
    figures = job_figures([(a, (0,)), (b, (1,)), (None, (2,))])
    assert figures["mfu"] == pytest.approx(0.3) and figures["goodput"] == pytest.approx(0.8)
    assert figures["j_per_step"] == 11.0
    # Two ranks on one GPU: its energy is counted once.
    assert job_figures([(a, (0,)), (b, (0,))])["j_per_step"] == 5.0


def test_share_text_keeps_small_shares_readable():
    assert [share_text(v) for v in (0.5, 0.034, 0.0025, 4.1e-5, 1e-9, 0.0, None)] == \
        ["50%", "3.4%", "0.25%", "0.004%", "<0.001%", "0%", "n/a"]


# -- the ledger ------------------------------------------------------------------------------------


def ledger_after(step_times: list[float], start_gap: float = 5.0) -> GoodputLedger:
    ledger = GoodputLedger(started=0.0)
    now = start_gap
    ledger.first_step(now)
    for t in step_times:
        now += t
        ledger.step(now, t, 0.0)
    return ledger


def test_ledger_books_stalls_and_hangs_against_the_typical_step():
    ledger = ledger_after([0.1] * 20 + [1.1] + [0.1] * 5 + [HANG_S + 0.1])
    s = ledger.seconds
    assert s["startup"] == 5.0
    assert s["stall"] == pytest.approx(1.0, abs=0.01)
    assert s["hang"] == pytest.approx(HANG_S, abs=0.01)
    assert s["productive"] == pytest.approx(27 * 0.1, abs=0.02)
    status = ledger.status(now=5.0 + sum([0.1] * 25) + 1.1 + HANG_S + 0.1)
    assert status["goodput"] == pytest.approx(s["productive"] / sum(s.values()), abs=1e-3)


def test_ledger_follows_a_new_pace_instead_of_calling_it_stalls():
    ledger = ledger_after([0.1] * 20 + [0.5] * (REGIME_STEPS + 10))
    assert ledger.seconds["stall"] == pytest.approx(0.0, abs=1e-9)
    assert ledger.typical == pytest.approx(0.5, rel=0.05)


def test_ledger_ignores_scheduler_jitter_on_tiny_steps():
    ledger = ledger_after([0.001] * 20 + [0.001 + LONG_STEP_MIN_S / 2])
    assert ledger.seconds["stall"] == 0.0


def test_ledger_open_wait_longer_than_a_hang_is_a_hang():
    ledger = ledger_after([0.1] * 10)
    last = ledger.last_step_at
    assert ledger.status(now=last + 0.05)["in_step_s"] == pytest.approx(0.05, abs=1e-3)
    hung = ledger.status(now=last + HANG_S + 10)
    assert hung["seconds"]["hang"] == pytest.approx(HANG_S + 10 - 0.1, abs=0.01)


# -- the live rule -------------------------------------------------------------------------------------


def _with_efficiency(mfu: float, best: float, util: float = 96.0):
    eff = Efficiency(flops_per_step=1e12, precision="bf16", device="H100 SXM", mfu=mfu,
                     best_mfu=best, achieved_flops=mfu * 989.5e12, peak_flops=989.5e12)
    p = ProcSample(pid=100, name="python", cpu_percent=30.0, gpu_mem=30 << 30, ppid=1,
                   agent=parse_status({"steps": 10}), efficiency=eff)
    return lambda t: snap(t, gpu(util=util, processes=(p,)))


def test_mfu_drop_against_the_jobs_best_window():
    def history(make, seconds=30):
        return [make(float(i)) for i in range(seconds)]

    found = evaluate(history(_with_efficiency(0.20, 0.45)), own_pid=OWN)
    drop = [f for f in found if f.id == "mfu-drop"]
    assert drop and drop[0].severity == "critical" and drop[0].pid == 100
    assert "best 30 s window" in drop[0].evidence and drop[0].next_step.startswith("gputop capture")
    assert not [f for f in evaluate(history(_with_efficiency(0.40, 0.45)), own_pid=OWN)
                if f.id == "mfu-drop"]
    warn = [f for f in evaluate(history(_with_efficiency(0.28, 0.45)), own_pid=OWN)
            if f.id == "mfu-drop"]
    assert warn and warn[0].severity == "warning"


def test_mfu_drop_gives_way_to_a_root_cause_on_its_gpu():
    eff = Efficiency(flops_per_step=1e12, precision="bf16", device="H100 SXM", mfu=0.1,
                     best_mfu=0.45)
    p = proc(cpu=5, workers=(97, 99, 95))
    p = replace(p, efficiency=eff)
    found = evaluate([snap(float(t), gpu(util=20, processes=(p,))) for t in range(30)],
                     own_pid=OWN)
    assert {f.id for f in found} == {"dataloader-stall"}
    assert "mfu-drop" in found[0].evidence


def test_job_row_and_json_carry_the_jobs_efficiency():
    from gputop.core.job_groups import jobs_in
    from gputop.tui.view.rows import build_rows

    def rank(r: int) -> ProcSample:
        eff = Efficiency(mfu=0.3 + 0.1 * r, achieved_flops=(0.3 + 0.1 * r) * 989.5e12,
                         peak_flops=989.5e12, goodput=0.9, j_per_step=500.0)
        return ProcSample(pid=200 + r, name="python", ppid=50, cmdline="python train.py",
                          agent=parse_status({"job_id": "job-1", "rank": r, "world_size": 2, "steps": 10,
                                 "steps_per_s": 2.0}), efficiency=eff)

    s = snap(0.0, gpu(0, processes=(rank(0),)), gpu(1, processes=(rank(1),)))
    row = next(r for r in build_rows(s) if r.job == "job-1")
    assert "MFU 35%" in row.cells["command"] and "goodput 90%" in row.cells["command"]
    assert "1 kJ/step" in row.cells["command"]  # two GPUs' 500 J each
    ranks = [r for r in build_rows(s) if r.pid in (200, 201)]
    assert all(r.cells["command"].startswith(("├─ rank", "└─ rank")) for r in ranks)
    assert "[MFU 30%, goodput 90%, 500 J/step]" in ranks[0].cells["command"]
    job = jobs_in(s)[0].to_json()
    assert job["efficiency"]["mfu"] == pytest.approx(0.35)
    assert job["efficiency"]["j_per_step"] == 1000.0
    assert [r["mfu"] for r in job["ranks"]] == [0.3, pytest.approx(0.4)]
