"""What a trace keeps when it holds more than its budget: the order in which detail is cut.

One order for the two places that cut, so a capture and an analysis agree on what matters:
the agent cuts an over-budget trace before it writes it (``gputop.agent.trace_budget``, a size
budget in bytes), and ``loading/load.py`` cuts what it holds in memory (a budget in events).

Tiers, kept first to cut first:

0. the frame of the trace: metadata, ``ProfilerStep#N``, the profiler's span: never cut;
1. the host calls the rules key on (DataLoader fetches, optimizer steps, ``.item()``,
   synchronisations, collectives, compiled regions);
2. device work and the runtime calls that launch it (kernels, copies, memsets, CUDA/HIP API);
3. CPU operators;
4. Python frames (``with_stack``);
5. everything else: memory events, flows, counters, instants.

Within a tier the shortest events go first: a long event holds the time the report names,
and a cut child's time stays inside its parent. Standard library only (the agent imports it).
"""

from __future__ import annotations

import math

FRAME, KEY, DEVICE, CPU_OP, PYTHON, OTHER = range(6)
TIER_NAMES = ("trace frame", "key host calls (DataLoader, optimizer, syncs)",
              "device work and launches", "CPU operators", "Python frames",
              "memory events, flows and instants")

_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset",
                          "cuda_runtime", "runtime", "cuda_driver", "cuda_sync", "gpu_user_annotation"})
_CPU_CATS = frozenset({"cpu_op", "operator", "user_annotation"})
_KEY_PREFIXES = ("ProfilerStep#", "enumerate(DataLoader)", "Optimizer.step", "Optimizer.zero_grad",
                 "aten::item", "aten::_local_scalar_dense", "Torch-Compiled Region",
                 "CompiledFunction", "nccl:", "c10d::", "gloo:", "record_param_comms")


def is_key_op(name: str) -> bool:
    """A host call the rules read by name: never cut."""
    return name.startswith(_KEY_PREFIXES) or name.endswith("Synchronize")


def tier(ph: str, cat: str, name: str) -> int:
    if ph == "M":
        return FRAME
    if ph == "X":
        low = cat.lower()
        if low in _CPU_CATS:
            if name.startswith("ProfilerStep#"):
                return FRAME
            return KEY if is_key_op(name) else CPU_OP
        if low in _DEVICE_CATS:
            return DEVICE
        if low == "python_function":
            return PYTHON
        if low == "trace":
            return FRAME
    return OTHER


# Durations are binned four to an octave: a threshold is one of these bin edges.
_BINS_PER_OCTAVE = 4
_MIN_US = 1.0 / 64


def duration_bin(dur_us: float) -> int:
    if not dur_us > _MIN_US:  # zero, negative or NaN: the shortest bin
        return 0
    if dur_us == math.inf:
        return 1 << 16
    return 1 + int(_BINS_PER_OCTAVE * math.log2(dur_us / _MIN_US))


def bin_floor_us(index: int) -> float:
    """The shortest duration that falls in bin ``index``."""
    if index <= 0:
        return 0.0
    return _MIN_US * math.pow(2.0, (index - 1) / _BINS_PER_OCTAVE)


def choose_cut(histograms: list[dict[int, float]], budget: float
               ) -> list[int | None]:
    """Per tier, the lowest duration bin kept (None: the whole tier is kept; a bin past every
    event: the whole tier cut), so that what is kept fits ``budget`` (bytes or events, as the
    histograms count). Tiers are filled in order, longest events first; tier 0 always stays,
    even over budget. A bin that does not fit whole is cut whole: the result stays within the
    budget."""
    left = budget - sum(histograms[FRAME].values())
    out: list[int | None] = [None]
    for hist in histograms[1:]:
        total = sum(hist.values())
        if total <= left:
            out.append(None)
            left -= total
            continue
        keep_from = max(hist, default=0) + 1
        for index in sorted(hist, reverse=True):
            if hist[index] > left:
                break
            left -= hist[index]
            keep_from = index
        out.append(keep_from)
        left = 0.0
    return out


def describe_cut(counts: list[tuple[int, int]], cut: list[int | None], budget: str
                 ) -> list[str]:
    """One line per tier that lost events: ``counts`` per tier (kept, cut)."""
    notes = []
    for index, (kept, dropped) in enumerate(counts):
        if not dropped:
            continue
        name = TIER_NAMES[index]
        floor = cut[index]
        if floor is not None and kept:
            why = f"shorter than {_us(bin_floor_us(floor))}"
        else:
            why = "all of them"
        notes.append(f"{dropped:,} {name} cut ({why}; {kept:,} kept): {budget}")
    return notes


def _us(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.3g} ms"
    return f"{value:.3g} us"
