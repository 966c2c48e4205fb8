"""Scripted GPU behaviour for the simulated NVML.

A scenario is a list of simulated GPUs, each with a board model and a behaviour that gives the
driver's readings as a pure function of (time, seed): the same seed replays the same run. Each GPU
also names the stand-in process the demo starts for it (``standin``), whose real CPU behaviour
matches what the GPU shows (see ``gputop/demo/standin.py``).

The readings are what a real driver reads (an H200, driver 580, running jobs with one known
problem each; ``tests/data/realgpu``):

* utilization is the share of time a kernel *or a copy* ran: copies at the link's rate keep it
  near 100 % with the SMs idle;
* GPM's SM activity is the share of SM-cycles with a warp resident, so it is the kernels' share
  of the time times how much of the GPU they fill (``fill``): a ResNet-18 at batch 256 fills
  ~80 %, 40 tiny layers ~1 %;
* every job starts up first (``STARTUP_S``): the context is made and the model built and copied
  with nothing running on the GPU while its memory fills;
* one behaviour per cause the live rules name (see ``SCENARIOS``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from gputop.core.pcie import capacity_mbs

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class GpuModel:
    name: str
    mem_total: int
    mem_reserved: int
    power_limit_w: float
    sm_clock_max: int
    mem_clock_max: int
    pcie_gen_max: int
    pcie_width_max: int
    pci_device_id: int
    has_gpm: bool
    has_fan: bool
    idle_power_w: float
    mem_bus_width: int = 0  # bits (nvmlDeviceGetMemoryBusWidth); 0: not reported


H100 = GpuModel("NVIDIA H100 80GB HBM3", 81559 * MIB, 527 * MIB, 700.0, 1980, 2619, 5, 16,
                0x233010DE, True, False, 70.0, 5120)
A100 = GpuModel("NVIDIA A100-SXM4-80GB", 81920 * MIB, 573 * MIB, 400.0, 1410, 1593, 4, 16,
                0x20B210DE, False, False, 55.0, 5120)
L40S = GpuModel("NVIDIA L40S", 46068 * MIB, 445 * MIB, 350.0, 2520, 9001, 4, 16,
                0x26B910DE, False, True, 35.0, 384)
K80 = GpuModel("Tesla K80", 11441 * MIB, 0, 149.0, 875, 2505, 3, 16,
               0x102D10DE, False, True, 30.0)

# Fields an older board or driver answers with NOT_SUPPORTED.
OLD_BOARD_UNSUPPORTED = frozenset(
    {"power", "energy", "pcie_throughput", "process_utilization", "gpm", "clock_events"}
)
# Versioned symbols an older libnvidia-ml does not export; callers must fall back.
OLD_DRIVER_MISSING = frozenset(
    {
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlGpmQueryDeviceSupport",
    }
)


# -- MIG ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MigSlice:
    """One MIG device of a simulated GPU (a GPU instance with one compute instance): its
    profile, ids, memory, the behaviour of the work on it and the demo's stand-in for that
    work (None: an empty instance). ``hide_process_memory``: the driver reports the memory of
    its processes as NVML_VALUE_NOT_AVAILABLE (what a non-root user sees in MIG mode)."""

    profile: str
    gpu_instance: int
    compute_instance: int
    mem_total: int
    kind: str
    standin: str | None = "trainer"
    hide_process_memory: bool = False


# H100 80GB in MIG mode with seven 1g.10gb instances (profile 19): each has 1/7 of the SMs
# and 1/8 of the memory (NVIDIA's MIG user guide, H100 profiles); the driver numbers the
# GPU instances of this layout 7 to 13, each with compute instance 0.
H100_1G_10GB = 81559 * MIB // 8
H100_MIG_7X1G = (
    MigSlice("1g.10gb", 7, 0, H100_1G_10GB, "healthy"),
    MigSlice("1g.10gb", 8, 0, H100_1G_10GB, "memory-leak"),
    MigSlice("1g.10gb", 9, 0, H100_1G_10GB, "healthy", hide_process_memory=True),
    MigSlice("1g.10gb", 10, 0, H100_1G_10GB, "idle", standin="idle"),
    MigSlice("1g.10gb", 11, 0, H100_1G_10GB, "idle", standin=None),
    MigSlice("1g.10gb", 12, 0, H100_1G_10GB, "idle", standin=None),
    MigSlice("1g.10gb", 13, 0, H100_1G_10GB, "idle", standin="idle"),
)
MIG_COMPUTE_SLICES = 7  # A100, H100 and H200 split their SMs into 7 compute slices
EMPTY_INSTANCE_MEM = 13 * MIB  # what an instance without processes shows used


@dataclass(frozen=True)
class GpuBehaviour:
    """One simulated GPU: board, behaviour kind, faults, and the stand-in process it runs."""

    kind: str
    model: GpuModel
    standin: str
    workers: int = 0
    lost_after: float | None = None
    unsupported: frozenset[str] = frozenset()
    extra_pids: int = 0  # processes NVML reports that the host cannot see (containers)
    mig: tuple[MigSlice, ...] = ()  # MIG mode on, with these MIG devices
    # Its stand-in is the real torch trainer compiled with torch.compile, whose last batch of
    # each epoch is smaller (a recompile), when torch is installed.
    compiled: bool = False


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    gpus: tuple[GpuBehaviour, ...]
    driver_version: str = "570.133.20"
    cuda_version: int = 12080
    missing_symbols: frozenset[str] = field(default_factory=frozenset)
    no_driver: bool = False


def _scenario(name, description, gpus, **kw) -> Scenario:
    return Scenario(name, description, tuple(gpus), **kw)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        _scenario(
            "healthy",
            "4x H100 busy at ~97%, nothing to fix",
            [GpuBehaviour("healthy", H100, "trainer", workers=2) for _ in range(4)],
        ),
        _scenario(
            "input-starved",
            "A100 waiting on DataLoader workers that each burn a core",
            [GpuBehaviour("input-starved", A100, "starved", workers=2)],
        ),
        _scenario(
            "host-sync",
            "A100 and a loop that blocks in a sync every (slow) step: it sleeps while the GPU "
            "works, and the GPU idles while it runs",
            [GpuBehaviour("host-sync", A100, "sync")],
        ),
        _scenario(
            "host-bound",
            "H100 mostly idle while the training thread runs Python bookkeeping between steps",
            [GpuBehaviour("host-bound", H100, "busy")],
        ),
        _scenario(
            "launch-bound",
            "H100 running many tiny kernels: utilization ~18 %, SM activity < 1 %, the "
            "launching thread saturated",
            [GpuBehaviour("tiny-kernels", H100, "busy")],
        ),
        _scenario(
            "memory-bound",
            "H100 busy at ~97% on memory-bound work: DRAM ~85% active, tensor pipes ~5% "
            "(element-wise and norm kernels, unfused)",
            [GpuBehaviour("memory-bound", H100, "trainer", workers=2)],
        ),
        _scenario(
            "throttled",
            "2x H100 held at the power cap, then thermally slowed",
            [GpuBehaviour("throttled", H100, "trainer", workers=2) for _ in range(2)],
        ),
        _scenario(
            "memory-leak",
            "H100 memory rising steadily toward OOM",
            [GpuBehaviour("memory-leak", H100, "trainer", workers=2)],
        ),
        _scenario(
            "pcie-bound",
            "A100 with the PCIe link saturated by host-to-device copies: utilization near 100 % "
            "(copies count) while the SMs wait",
            [GpuBehaviour("pcie-bound", A100, "trainer", workers=2)],
        ),
        _scenario(
            "gpu-lost",
            "4x A100; GPU 2 falls off the bus after 8 s",
            [
                GpuBehaviour("healthy", A100, "trainer", workers=1, lost_after=8.0 if i == 2 else None)
                for i in range(4)
            ],
        ),
        _scenario(
            "unsupported",
            "2x Tesla K80 on an old driver: no power, PCIe throughput, GPM or per-process data",
            [
                GpuBehaviour("healthy", K80, "trainer", workers=1, unsupported=OLD_BOARD_UNSUPPORTED)
                for _ in range(2)
            ],
            driver_version="470.256.02",
            cuda_version=11040,
            missing_symbols=OLD_DRIVER_MISSING,
        ),
        _scenario("no-driver", "no NVIDIA driver installed (NVML missing)", [], no_driver=True),
        _scenario(
            "mig",
            "H100 in MIG mode: seven 1g.10gb instances, each with its own work",
            [GpuBehaviour("healthy", H100, "trainer", mig=H100_MIG_7X1G)],
        ),
        _scenario(
            "tour",
            "10 GPUs, a different problem on each",
            [
                GpuBehaviour("input-starved", A100, "starved", workers=2),
                GpuBehaviour("host-sync", A100, "sync"),
                GpuBehaviour("throttled", H100, "trainer", workers=1),
                GpuBehaviour("memory-leak", H100, "trainer", workers=1),
                GpuBehaviour("pcie-bound", H100, "trainer", workers=1),
                # shared, and its job (the real torch trainer) compiled: it recompiles on the
                # last batch of each epoch
                GpuBehaviour("healthy", H100, "trainer", workers=1, extra_pids=1, compiled=True),
                GpuBehaviour("idle", L40S, "idle"),
                GpuBehaviour("healthy", L40S, "trainer", workers=1, lost_after=20.0),
                GpuBehaviour("host-bound", H100, "busy"),
                GpuBehaviour("tiny-kernels", H100, "busy"),
            ],
        ),
    ]
}


def describe_scenarios() -> str:
    width = max(len(n) for n in SCENARIOS)
    return "\n".join(f"{name:<{width}}  {s.description}" for name, s in SCENARIOS.items())


@dataclass(frozen=True)
class GpuReading:
    """What the simulated driver reports for one GPU at one instant."""

    util_gpu: float
    util_mem: float
    mem_used: int
    power_w: float
    pcie_tx_kbs: float
    pcie_rx_kbs: float
    temperature_c: float
    fan_percent: float
    sm_clock: float
    mem_clock: float
    pcie_gen: int
    clock_events: int
    pstate: int
    ecc_volatile: int
    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float


# NVML clock-event reason bits (nvmlClocksEventReason*).
REASON_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40

# Seconds per simulated step of the host-sync GPU; not a multiple of common sampling intervals,
# so 1 s samples walk across the whole cycle instead of hitting the same phases. For the first
# HOST_SYNC_BUSY of each step the GPU works while the host waits in a blocking sync; for the
# rest the host runs (its Python, the next launches) while the GPU idles. The demo's stand-in
# follows the same clock (``gputop/demo/standin.py``).
HOST_SYNC_PERIOD = 2.6
HOST_SYNC_BUSY = 0.7
# A job's start-up in the demo: context, model build and copy, first batches (a real one takes
# 5-10 s; the demo's are short so that its findings come soon).
STARTUP_S = 3.0
# Copies move at about this share of the link's theoretical rate (packet headers and flow
# control take the rest of it).
COPY_EFFICIENCY = 0.92


_MASK = (1 << 64) - 1


def _noise(seed: int, gpu: int, t: float, channel: int) -> float:
    """Deterministic noise in [-1, 1], piecewise constant over 0.5 s (a splitmix64 hash)."""
    x = (seed * 0x9E3779B97F4A7C15 + gpu * 0xBF58476D1CE4E5B9 + channel * 0x94D049BB133111EB
         + int(t * 2) * 0x2545F4914F6CDD1D) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return x / float(1 << 63) - 1.0


@dataclass(frozen=True)
class _Work:
    """What a GPU does at one instant: the share of time kernels run, how much of the GPU they
    fill (SM activity over kernel time), and the PCIe traffic (MB/s)."""

    kernels: float
    fill: float
    rx: float
    tx: float


# How much of the GPU each behaviour's kernels fill while they run.
FILL = {"healthy": 0.78, "throttled": 0.78, "memory-leak": 0.78, "input-starved": 0.4,
        "host-sync": 0.8, "pcie-bound": 0.5, "host-bound": 0.35, "tiny-kernels": 0.015,
        "idle": 0.0, "memory-bound": 0.7}
# The share of its SM activity with tensor pipes busy, and of its kernel time with DRAM busy.
TENSOR_SHARE = {"healthy": 0.55, "throttled": 0.55, "memory-leak": 0.55, "memory-bound": 0.07}
DRAM_SHARE = {"memory-bound": 0.88}


def _work(kind: str, t: float, n, link_mbs: float) -> _Work:
    fill = FILL.get(kind, 0.78)
    if kind == "input-starved":
        # A little work per batch, the rest waiting for the next one (H200: 2-4 %).
        return _Work(0.04 + 0.015 * n(0), fill, 150.0 + 100 * n(2), 10.0 + 5 * n(3))
    if kind == "host-sync":
        phase = (t % HOST_SYNC_PERIOD) / HOST_SYNC_PERIOD
        busy = phase < HOST_SYNC_BUSY
        return _Work(0.95 + 0.03 * n(0) if busy else 0.02, fill,
                     (900.0 if busy else 30.0) + 50 * n(2), 80.0 + 20 * n(3))
    if kind == "pcie-bound":
        # Copies at the link's rate and a small matmul on what arrived (H200: 55-59 GB/s of
        # Gen5 x16, utilization ~100 %, SM activity < 1 %).
        return _Work(0.04 + 0.01 * n(0), fill, link_mbs * (0.90 + 0.02 * n(2)), 40.0 + 10 * n(3))
    if kind == "host-bound":
        # The step's kernels, then the host's Python bookkeeping with nothing to run.
        return _Work(0.10 + 0.015 * n(0), fill, 120.0 + 30 * n(2), 25.0 + 5 * n(3))
    if kind == "tiny-kernels":
        # Kernels of a block or two each, launched one by one (H200: 15-21 %, SM < 1 %).
        return _Work(0.18 + 0.02 * n(0), fill, 8.0 + 2 * n(2), 4.0 + n(3))
    if kind == "idle":
        return _Work(0.0, fill, 0.0, 0.0)
    busy = 0.99 + 0.005 * n(0) if kind == "throttled" else 0.97 + 0.02 * n(0)
    return _Work(busy, fill, 1800.0 + 300 * n(2), 150.0 + 40 * n(3))


def _mem_frac(kind: str, t: float, n) -> float:
    if kind == "memory-leak":
        # Grows 0.4 %/s from 30 %; the simulated job "restarts" when it would OOM.
        return 0.30 + 0.004 * (t % 170.0)
    if kind == "idle":
        return 0.41  # memory held, nothing running: a job waiting on I/O or a peer
    return 0.72 + 0.005 * n(1)


def reading(behaviour: GpuBehaviour, index: int, t: float, seed: int) -> GpuReading:
    """The driver's readings for GPU ``index`` at ``t`` seconds into the run."""
    if behaviour.mig:
        return mig_parent_reading(behaviour, index, t, seed)
    m = behaviour.model

    def n(ch: int) -> float:
        return _noise(seed, index, t, ch)

    kind = behaviour.kind
    link_mbs = capacity_mbs(m.pcie_gen_max, m.pcie_width_max)
    events = 0
    clock_frac = 0.98
    temp = 66.0 + 2 * n(4)
    ecc = 0
    if t < STARTUP_S:
        # Start-up: the context, then the model is built and its memory fills; nothing runs.
        work = _Work(0.0, 0.0, 0.5 + 0.1 * n(2), 10.0 + 2 * n(3))
        mem_frac = 0.005 + (_mem_frac(kind, STARTUP_S, n) - 0.005) * t / STARTUP_S
        events = REASON_IDLE
        clock_frac = 0.3
        temp = 38.0 + n(4)
    else:
        work = _work(kind, t, n, link_mbs)
        mem_frac = _mem_frac(kind, t, n)
        if kind == "throttled":
            if t >= 3.0:
                events |= REASON_SW_POWER_CAP
                clock_frac = 0.72 + 0.02 * n(5)
            if t >= 40.0:
                temp = min(92.0, 84.0 + (t - 40.0) * 0.4) + 0.5 * n(4)
                events |= REASON_SW_THERMAL
                if t >= 50.0:
                    events |= REASON_HW_THERMAL
                clock_frac = 0.55 + 0.02 * n(5)
            else:
                temp = 78.0 + 2 * n(4)
        elif kind == "idle":
            events = REASON_IDLE
            clock_frac = 0.1
            temp = 36.0 + n(4)
        elif work.kernels < 0.5:
            temp = 48.0 + 2 * n(4)

    if behaviour.lost_after is not None and t >= behaviour.lost_after - 3.0:
        ecc = 1 + int(max(0.0, t - (behaviour.lost_after - 3.0)) * 4)  # errors before the loss

    kernels = max(0.0, min(1.0, work.kernels))
    rx, tx = max(0.0, work.rx), max(0.0, work.tx)
    copies = min(1.0, max(rx, tx) / (link_mbs * COPY_EFFICIENCY))
    # NVML utilization: the share of time a kernel or a copy ran (taken as independent).
    util = 100.0 * (1.0 - (1.0 - kernels) * (1.0 - copies))
    busy = kernels * 0.85 + copies * 0.15  # copies draw little power
    power = m.idle_power_w + (m.power_limit_w - m.idle_power_w) * busy + 8 * n(6)
    if events & REASON_SW_POWER_CAP:
        power = m.power_limit_w * (0.995 + 0.004 * n(6))
    power = max(m.idle_power_w * 0.8, min(power, m.power_limit_w))
    sm_active = 100.0 * kernels * work.fill
    tensor = sm_active * TENSOR_SHARE.get(kind, 0.2)
    working = t >= STARTUP_S and kind != "idle"
    return GpuReading(
        util_gpu=round(util),
        util_mem=round(100.0 * kernels * 0.45),
        mem_used=int(m.mem_total * mem_frac),
        power_w=power,
        pcie_tx_kbs=tx * 1000,
        pcie_rx_kbs=rx * 1000,
        temperature_c=round(temp),
        fan_percent=round(30 + 0.6 * max(0.0, temp - 30)),
        sm_clock=round(m.sm_clock_max * clock_frac),
        mem_clock=m.mem_clock_max if working else round(m.mem_clock_max * 0.2),
        pcie_gen=m.pcie_gen_max if working else 1,
        clock_events=events,
        pstate=0 if working else 8,
        ecc_volatile=ecc,
        sm_active=sm_active,
        sm_occupancy=sm_active * 0.6,
        tensor_active=tensor,
        dram_active=100.0 * kernels * DRAM_SHARE.get(kind, 0.5),
    )


def is_lost(behaviour: GpuBehaviour, t: float) -> bool:
    return behaviour.lost_after is not None and t >= behaviour.lost_after


def sm_util_share(n_procs: int) -> list[float]:
    """How a GPU's SM time splits over its visible processes (first one dominates)."""
    if n_procs <= 0:
        return []
    weights = [1.0 / (i + 1) for i in range(n_procs)]
    total = math.fsum(weights)
    return [w / total for w in weights]


# -- MIG readings ------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def mig_slice_behaviour(behaviour: GpuBehaviour, slot: int) -> GpuBehaviour:
    """The work on one MIG device, as a GPU of the instance's size."""
    piece = behaviour.mig[slot]
    model = replace(behaviour.model, name=f"{behaviour.model.name} MIG {piece.profile}",
                    mem_total=piece.mem_total, mem_reserved=0)
    return GpuBehaviour(piece.kind, model, piece.standin or "idle")


def mig_slice_reading(behaviour: GpuBehaviour, index: int, slot: int, t: float,
                      seed: int) -> GpuReading:
    """What the work on MIG device ``slot`` of GPU ``index`` reads at ``t``; an instance
    without work holds only the driver's few MiB."""
    r = reading(mig_slice_behaviour(behaviour, slot), 1000 + 16 * index + slot, t, seed)
    if behaviour.mig[slot].standin is None:
        r = replace(r, util_gpu=0, util_mem=0, mem_used=EMPTY_INSTANCE_MEM, sm_active=0.0,
                    sm_occupancy=0.0, tensor_active=0.0, dram_active=0.0)
    return r


def compute_slices(profile: str) -> int:
    """"1g.10gb" -> 1: the compute slices (sevenths of the SMs) a profile has."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 1


def mig_parent_reading(behaviour: GpuBehaviour, index: int, t: float, seed: int) -> GpuReading:
    """The whole GPU in MIG mode: the memory of its instances added up, SM activity and power
    from their work weighted by their share of the SMs; clocks and temperature as the GPU's
    own behaviour has them."""
    base = reading(replace(behaviour, mig=()), index, t, seed)
    parts = [(compute_slices(piece.profile) / MIG_COMPUTE_SLICES,
              mig_slice_reading(behaviour, index, slot, t, seed))
             for slot, piece in enumerate(behaviour.mig)]
    m = behaviour.model

    def share(field: str) -> float:
        return math.fsum(w * getattr(r, field) for w, r in parts)

    busy = share("util_gpu") / 100.0
    power = m.idle_power_w + (m.power_limit_w - m.idle_power_w) * busy * 0.85
    return replace(base, util_gpu=round(share("util_gpu")), util_mem=round(share("util_mem")),
                   mem_used=sum(r.mem_used for _, r in parts), power_w=power,
                   sm_active=share("sm_active"), sm_occupancy=share("sm_occupancy"),
                   tensor_active=share("tensor_active"), dram_active=share("dram_active"))
