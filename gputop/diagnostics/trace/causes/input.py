"""The input pipeline in a trace: ``dataloader-stall`` and the DataLoader's host time.
"""

from __future__ import annotations

from gputop.core.format import ms_h
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import (
    WARNING_SHARE,
    Finding,
    severity_for,
)
from gputop.diagnostics.trace.causes.common import (
    capture_or_run,
    cost_of,
    device_word,
    of_what,
    percent,
    share_of,
    training_app,
    window_phrase,
)
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics


def dataloader_stall(m: TraceMetrics) -> list[Finding]:
    dl = m.values["dataloader"]
    if not dl["calls"]:
        return []
    cost = cost_of(m, "dataloader")
    share = share_of(m, cost)
    if share < WARNING_SHARE:
        return []
    workers = (
        "num_workers=0 (_SingleProcessDataLoaderIter): batches are loaded in the training "
        "process, between steps"
        if dl["single_process"]
        else f"{dl['iterator'] or 'multi-process iterator'}: the workers do not keep up"
    )
    if dl["single_process"]:
        fix = (
            "Load batches in parallel: DataLoader(..., num_workers=4 to 8 per GPU (up to the "
            "free CPU cores), pin_memory=True, persistent_workers=True, prefetch_factor=2); "
            "keep __getitem__ cheap (decode once, cache, move augmentation to the GPU)."
        )
    else:
        fix = (
            "Give the input pipeline more throughput: raise num_workers and prefetch_factor, "
            "set persistent_workers=True and pin_memory=True, and make each sample cheaper "
            "(pre-decoded/cached data, GPU-side augmentation, faster storage)."
        )
    return [
        Finding(
            id="dataloader-stall",
            severity=severity_for(share),
            title=f"The {device_word(m)} waits for the DataLoader {percent(share)} of the {of_what(m)}",
            evidence=(
                f"{ms_h(cost)} {window_phrase(m)} with the {device_word(m)} idle while the training "
                f"loop waits in enumerate(DataLoader).__next__ ({dl['calls']} calls, "
                f"{ms_h(dl['time_ms'])} in all, longest {ms_h(dl['max_call_ms'])}); {workers}."
            ),
            fix=fix,
            next_step=ns.pyspy_record(m.details.get("pid"), "loader.svg", app=training_app(m)),
            cost_s=cost / 1e3,
        )
    ]


def host_dataloader(m: TraceMetrics) -> list[Finding]:
    """GPU activity not recorded: the DataLoader's share of the training thread's step time
    (TensorBoard's DataLoader share is this same host time), not a device's idle."""
    dl = m.values["dataloader"]
    ms = m.values["host_breakdown"]["ms"].get("dataloader", 0.0)
    share = share_of(m, ms)
    if not dl["calls"] or share < WARNING_SHARE:
        return []
    workers = ("num_workers=0: batches are loaded in the training process"
               if dl["single_process"] else "the workers do not keep up")
    return [Finding(
        id="dataloader-stall",
        severity=severity_for(share),
        title=(f"The training loop waits for the DataLoader {percent(share)} of the {of_what(m)} "
               "(GPU activity not recorded)"),
        evidence=(f"the training thread spent {ms_h(ms)} {window_phrase(m)} in "
                  f"enumerate(DataLoader).__next__ ({dl['calls']} calls, longest "
                  f"{ms_h(dl['max_call_ms'])}); {workers}. Whether the GPU idled meanwhile is "
                  "not in the trace."),
        fix=("Load batches in parallel: DataLoader(num_workers=4 to 8 per GPU, pin_memory=True, "
             "persistent_workers=True, prefetch_factor=2), and record the GPU too "
             "(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) to see what it costs."),
        next_step=capture_or_run(m),
        cost_s=ms / 1e3,
    )]
