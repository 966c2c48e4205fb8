"""The one check of an agent's status (issue 37): every number against its meaning."""

from __future__ import annotations

from gputop.core.agent_status import parse_status
from gputop.core.efficiency import efficiency
from gputop.core.model import GpuSample
from gputop.core.validate import json_depth, number


def test_out_of_range_values_are_dropped_and_named():
    status = parse_status({"ok": True, "steps": -5, "steps_per_s": 1e9, "step_time_p50_s": -1,
                           "step_time_p95_s": float("inf"), "dataloader_wait_share": 7.5,
                           "rank": True, "job_id": "x\x1b[2J",
                           "goodput": {"goodput": 1.0, "seconds": {"stall": 5, "hang": 5}}})
    assert status.steps is None and status.steps_per_s is None and status.rank is None
    assert status.step_time_p50_s is None and status.dataloader_wait_share is None
    assert status.goodput is None and status.job_id is None
    assert set(status.rejected) == {"steps", "steps_per_s", "step_time_p50_s",
                                    "step_time_p95_s", "dataloader_wait_share", "rank",
                                    "job_id", "goodput.goodput"}
    assert status.to_dict()["rejected"] == list(status.rejected)


def test_good_values_pass_and_a_counter_never_goes_back():
    reply = {"ok": True, "steps": 120, "steps_per_s": 2.5, "step_time_p50_s": 0.4,
             "step_time_p95_s": 0.5, "dataloader_wait_share": 0.8, "rank": 3,
             "goodput": {"goodput": 0.5, "seconds": {"productive": 5.0, "stall": 5.0}}}
    status = parse_status(reply, last_steps=100)
    assert status.rejected == () and status.steps == 120 and status.goodput == 0.5
    assert "rejected" not in status.to_dict()
    went_back = parse_status(reply, last_steps=121)
    assert went_back.steps is None and went_back.rejected == ("steps (went back)",)


def test_flops_above_the_devices_peak_are_not_shown():
    agent = parse_status({"ok": True, "steps_per_s": 100.0, "flops": {"last": {
        "ok": True, "flops_per_step": 1e15, "precision": "fp32", "samples_per_step": 8}}})
    eff = efficiency(agent, GpuSample(0, name="NVIDIA A100-SXM4-80GB"))
    assert eff.mfu is None and eff.achieved_flops is None and "dropped" in eff.mfu_note
    honest = parse_status({"ok": True, "steps_per_s": 10.0, "flops": {"last": {
        "ok": True, "flops_per_step": 1e11, "precision": "fp32", "samples_per_step": 8}}})
    eff = efficiency(honest, GpuSample(0, name="NVIDIA A100-SXM4-80GB"))
    assert eff.mfu is not None and 0 < eff.mfu < 1


def test_the_shared_validator():
    assert number(True) is None and number(float("nan")) is None and number("3") is None
    assert number("3", parse=True) == 3.0 and number(2.0, integer=True) == 2
    assert number(2.5, integer=True) is None and number(5, 0, 4) is None
    assert json_depth(b"[" * 100_000, 64) is False
    assert json_depth(b'{"a": "[[[[[[[[[["}', 2) is True
