"""What a memory report says, judged: does memory grow, what makes the peak, and is the
allocator's reserved memory fragmented (the cause, with the setting that addresses it).

The allocator's rules come from PyTorch's documentation of the CUDA caching allocator
("CUDA semantics: memory management", ``torch.cuda.memory_stats``):

* on an allocation it cannot serve, the allocator first frees its cached, wholly unused
  segments (``cudaFree``) and retries; only memory in *split* segments (a free block beside a
  live one: ``inactive_split_bytes``, "non-releasable") cannot be given back. So an OOM whose
  request was no larger than the reserved-but-unallocated memory failed because that memory
  was in pieces: fragmentation. PyTorch's own OOM message says "If reserved but unallocated
  memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid
  fragmentation";
* without a failure, fragmentation is named when the non-releasable free memory is at least
  ``FRAGMENTED_SHARE`` of what the allocator reserved: that much of the process's GPU memory
  serves only allocations that fit its pieces (a quarter: our line, stated, not PyTorch's);
* ``num_alloc_retries`` counts cudaMalloc calls that failed and were retried after freeing the
  cache: the device's memory is at its limit.

Pure; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.capture.memory.report import MemoryReport

FRAGMENTED_SHARE = 0.25
EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


@dataclass(frozen=True)
class Verdict:
    # growth | activations | peak-<part> | fragmentation | cache | in-use | retries |
    # cpu-allocator
    id: str
    text: str
    fix: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "text": self.text, "fix": self.fix}


def size(n: float | None) -> str:
    """Bytes in binary units, three figures: 4.00 MiB, 18.3 KiB, 512 MiB."""
    if n is None:
        return "n/a"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            value = n / scale
            digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
            return f"{value:.{digits}f} {unit}"
    return f"{n:.0f} B"


def _fragmentation_fix(report: MemoryReport) -> str:
    if report.allocator.expandable_segments or "expandable_segments:True" in (
            report.allocator.settings or ""):
        return ("expandable_segments is on already: cap block splitting with "
                "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<MB>, or keep allocation sizes "
                "steady (pad variable shapes to a few buckets)")
    return (f"set {EXPANDABLE} (segments grow in place instead of leaving gaps), or keep "
            "allocation sizes steady (pad variable shapes to a few buckets)")


def allocator_verdicts(report: MemoryReport) -> list[Verdict]:
    """Reserved versus allocated, judged."""
    a = report.allocator
    if not a.caching:
        return [Verdict("cpu-allocator", "the CPU allocator does not cache: freed memory goes "
                        "back to the C library at once (reserved = allocated; no segments)")]
    out: list[Verdict] = []
    reserved, allocated = a.reserved, a.allocated
    if reserved is None or allocated is None:
        return out
    unallocated = max(0, reserved - allocated)
    split = a.inactive_split if a.inactive_split is not None else (
        a.segments.free if a.segments is not None else 0)
    largest = a.segments.largest_free if a.segments is not None else None
    oom = report.oom
    if oom is not None and oom.requested is not None:
        if oom.requested <= unallocated:
            out.append(Verdict(
                "fragmentation",
                f"fragmentation caused this out-of-memory error: {size(unallocated)} was "
                f"reserved but unallocated, enough for the {size(oom.requested)} asked for, "
                "but in pieces" + (f" (the largest free block: {size(largest)})"
                                   if largest is not None else ""),
                _fragmentation_fix(report)))
        else:
            free = oom.device_free if oom.device_free is not None else a.device_free
            out.append(Verdict(
                "in-use",
                f"the memory was in use: {size(allocated)} allocated by live tensors, "
                f"{size(unallocated)} reserved but free"
                + (f", {size(free)} free on the device" if free is not None else "")
                + f", and {size(oom.requested)} asked for",
                "hold less at once: what grows (below), the peak's largest part, a smaller "
                "batch, activation checkpointing, mixed precision"))
    elif reserved and split >= FRAGMENTED_SHARE * reserved:
        out.append(Verdict(
            "fragmentation",
            f"fragmented: {size(split)} of the {size(reserved)} reserved is free but in split "
            f"segments that cannot be given back ({split / reserved:.0%})"
            + (f"; the largest free block is {size(largest)}" if largest is not None else ""),
            _fragmentation_fix(report)))
    elif reserved:
        out.append(Verdict(
            "cache", f"reserved {size(reserved)}, allocated {size(allocated)}: "
            f"{size(unallocated)} cached for reuse, {size(split)} of it non-releasable "
            f"({split / reserved:.0%}, under the {FRAGMENTED_SHARE:.0%} that would be "
            "fragmentation)"))
    if a.alloc_retries:
        out.append(Verdict(
            "retries", f"cudaMalloc failed {a.alloc_retries} time(s) and the allocator retried "
            "after freeing its cache: the device's memory is at its limit",
            "see what grows and what makes the peak; each retry costs a synchronisation"))
    return out


def growth_verdict(report: MemoryReport) -> Verdict | None:
    if not report.growth or not report.steps:
        return None
    total = sum(x.bytes_per_step for x in report.growth)
    top = report.growth[0]
    where = top.location() or "allocations without a Python frame (C++ or autograd's thread)"
    steady = "rose at every step" if top.steady else "not at every step"
    return Verdict("growth", f"memory grows {size(total)} per step; most at {where} "
                   f"(+{size(top.bytes_per_step)}/step, {steady})",
                   "keep what a step needs only for that step: .item() or .detach() what is "
                   "logged, bound caches, do not append tensors to lists across steps")


def peak_verdict(report: MemoryReport) -> Verdict | None:
    p = report.peak
    if p is None:
        return None
    parts = {name: getattr(p.parts, name) for name in p.parts.__struct_fields__}
    name, largest = max(parts.items(), key=lambda kv: kv[1])
    label = name.replace("_", " ")
    fixes = {
        "activations": "activation checkpointing (torch.utils.checkpoint), a smaller batch, "
                       "mixed precision (autocast)",
        "optimizer_state": "a lighter optimizer state (8-bit Adam, Adafactor) or sharding it "
                           "(ZeRO / FSDP)",
        "parameters": "lower precision weights (bf16), sharding (FSDP)",
        "gradients": "gradient accumulation keeps one set; sharding (FSDP) splits it",
        "other": "see what grows and what the step keeps",
    }
    share = largest / p.bytes if p.bytes else 0.0
    return Verdict("activations" if name == "activations" else f"peak-{name}",
                   f"the peak of step {p.step} is {size(p.bytes)}; its largest part is "
                   f"{label} ({size(largest)}, {share:.0%})", _scaled(report, fixes[name]))


SMALL_PEAK = 256 * 1024 * 1024  # below this (and a small share of the device) nothing to fix
ROOMY_SHARE = 0.5  # a peak under half of the device's memory leaves room


def _scaled(report: MemoryReport, fix: str) -> str:
    """The advice as big as what is at stake: none for a small peak, a hint while the device
    has room, the full fix when the peak nears its memory (or the device is unknown)."""
    peak = report.peak.bytes if report.peak is not None else 0
    total = report.allocator.device_total
    share = peak / total if total else None
    if peak < SMALL_PEAK and (share is None or share < ROOMY_SHARE):
        return (f"nothing to do: a {size(peak)} peak is small; if a larger model or batch "
                f"needs room later: {fix}")
    if share is not None and share < ROOMY_SHARE:
        return (f"the peak is {share:.0%} of the device's {size(total)}: room to spare; "
                f"for a larger batch: {fix}")
    return fix


def verdicts(report: MemoryReport) -> list[Verdict]:
    out = [v for v in (growth_verdict(report), peak_verdict(report)) if v is not None]
    return out + allocator_verdicts(report)
