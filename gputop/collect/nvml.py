"""GPU sampling through NVML (nvidia-ml-py).

Every field is read on its own and is ``None`` when the driver refuses it; a refusal that will not
change (NOT_SUPPORTED, NO_PERMISSION, a missing symbol) is remembered per GPU so the call is not
retried every tick. Versioned calls fall back to their older forms when the library lacks them.
A GPU that falls off the bus (GPU_IS_LOST), or whose handle the driver stops knowing
(INVALID_ARGUMENT even for its UUID), is reported ``lost`` while the others carry on. A driver
that cannot count its GPUs says why in ``DriverInfo.error``. Without a driver,
``open()`` returns a ``DriverInfo`` that says so; nothing raises.

PCIe throughput is the one slow read: the driver counts bytes for 20 ms per call (TX and RX
are two calls), so 8 GPUs read one after the other would block a tick for 320 ms. The first
tick (a snapshot's only one, the monitor's first frame) reads every GPU at once on helper
threads that end with it. After it, one reader thread per ``GPUS_PER_READER`` GPUs reads them
in turn, started before the rest of the tick (``start_pcie``) so they overlap it; the tick
takes them once, after its other reads, waiting at most ~0.3 s, off the interface's thread. One
thread sleeps in the driver instead of one per GPU (every thread costs a stack and
memory).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gputop.collect.mig import MigMixin, gpm_values
from gputop.core.format import MIB
from gputop.core.model import DriverInfo, GpuSample, evolve

log = logging.getLogger(__name__)

# Refusals that will not change while we run: stop asking.
_PERMANENT = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
}

CLOCK_EVENT_NAMES = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# The reasons that mean the clock is being held down against the workload's will.
THROTTLE_EVENTS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})

GPM_METRICS = {
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}
# A whole GPU's GPM also counts its PCIe traffic (MiB/s between the two samples, nvml.h): where
# it does, the tick needs no nvmlDeviceGetPcieThroughput, which blocks 20 ms per direction and
# samples only those 20 ms of the second.
DEVICE_GPM_METRICS = {
    **GPM_METRICS,
    "pcie_tx_mibs": pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    "pcie_rx_mibs": pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
}


def decode_clock_events(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in CLOCK_EVENT_NAMES.items() if mask & bit)


def _cuda_version_text(version: int) -> str:
    return f"{version // 1000}.{(version % 1000) // 10}"


# Fields that change over seconds, not within one (limits, link state, fan, P-state, memory
# clock) are read every SLOW_EVERY samples and carried over in between, as nvitop does too;
# so are the ECC error counters (the hardware-errors rule looks for growth over its window,
# DCGM's default watch reads them less often still). A tick of 8 GPUs makes 64 driver calls
# fewer.
SLOW_EVERY = 5


class _Lost(Exception):
    """The GPU answered NVML_ERROR_GPU_IS_LOST, or its handle stopped being valid."""


@dataclass
class _Device:
    index: int
    handle: Any
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    unsupported: set[str] = field(default_factory=set)  # the per-GPU capability cache
    static: dict[str, Any] = field(default_factory=dict)
    gpm_prev: Any = None
    gpm_spare: Any = None  # the sample before gpm_prev, reused for the next reading
    gpm_checked: bool = False
    pcie_from_gpm: bool = False  # the last tick's GPM counted PCIe: no blocking reads
    proc_util_seen: int = 0
    lost: bool = False
    ticks: int = 0  # samples taken: the slow fields are read every SLOW_EVERY of them
    slow: dict[str, Any] = field(default_factory=dict)


def describe_init_error(exc: BaseException) -> str:
    value = getattr(exc, "value", None)
    if value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVIDIA driver not available (libnvidia-ml.so.1 not found)"
    if value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "NVIDIA driver not loaded (the kernel module is not running)"
    if value == pynvml.NVML_ERROR_NO_PERMISSION:
        return "NVIDIA driver refused access (no permission for /dev/nvidia*)"
    return f"NVIDIA driver not usable: {exc}"


def device_count() -> tuple[int | None, str | None]:
    """(how many GPUs the driver reports, None) or (None, why not): a short init."""
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        return None, describe_init_error(exc)
    try:
        return int(pynvml.nvmlDeviceGetCount()), None
    except pynvml.NVMLError as exc:
        return None, f"NVIDIA driver did not count its GPUs: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


_Row = tuple[GpuSample, list[tuple[int, int | None]], dict[int, float]]

# GPUs read in turn by one PCIe reader thread after the first tick: 8 x 2 x 20 ms, a tick
# waits at most ~0.3 s for them (the interval is 1 s by default; the tick's cadence holds).
GPUS_PER_READER = 8


class NvmlCollector(MigMixin):
    """Samples every GPU NVML reports (or those in ``only``) on each ``sample()`` call."""

    def __init__(self, only: list[int] | None = None) -> None:
        self.only = only
        self.devices: list[_Device] = []
        self.driver = DriverInfo(available=False, error="NVML not initialised")
        self._open = False
        self._pcie_first: ThreadPoolExecutor | None = None  # the first tick's, all GPUs at once
        self._pcie_pool: ThreadPoolExecutor | None = None  # then one reader thread
        self._pcie_readers = 1
        # GPU index -> the read of its thread's share of the tick's GPUs (one future for
        # several GPUs: _read_pcie_share)
        self._pcie: dict[int, Future[dict[int, tuple[int | None, int | None] | _Lost]]] = {}
        # False skips the PCIe reads (the GPUs' PCIe columns empty for that tick): the
        # first frame's sample does not wait the driver's 20 ms for them (early_start).
        self.read_pcie = True

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> DriverInfo:
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as exc:
            self.driver = DriverInfo(available=False, error=describe_init_error(exc))
            return self.driver
        self._open = True
        driver_version = self._system(pynvml.nvmlSystemGetDriverVersion)
        cuda = self._system(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        if cuda is None:
            cuda = self._system(pynvml.nvmlSystemGetCudaDriverVersion)
        nvml_version = self._system(pynvml.nvmlSystemGetNVMLVersion)
        count, count_error = 0, None
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
            count_error = f"the driver did not count its GPUs (nvmlDeviceGetCount: {exc})"
        for index in range(count):
            if self.only is not None and index not in self.only:
                continue
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:
                log.info("GPU %d: no handle: %s", index, exc)
                dev = _Device(index, None, lost=True)
                self.devices.append(dev)
                continue
            dev = _Device(index, handle)
            self._read_static(dev)
            self.devices.append(dev)
        for dev in self.devices:
            self._prime_gpm(dev)  # GPM metrics are rates: the first tick has a sample to compare
        self.driver = DriverInfo(
            available=True,
            driver_version=driver_version,
            cuda_version=_cuda_version_text(cuda) if cuda else None,
            nvml_version=nvml_version,
            error=count_error,  # the driver answers, but lists no GPU: why
        )
        return self.driver

    def close(self) -> None:
        if not self._open:
            return
        for pool in (self._pcie_first, self._pcie_pool):
            if pool is not None:
                pool.shutdown(wait=True)  # no read may outlive nvmlShutdown
        self._pcie_first = self._pcie_pool = None
        self._pcie = {}
        for dev in self.devices:
            for sample in (dev.gpm_prev, dev.gpm_spare):
                if sample is not None:
                    self._quiet(pynvml.nvmlGpmSampleFree, sample)
            dev.gpm_prev = dev.gpm_spare = None
            self.mig_close(dev)
        self._quiet(pynvml.nvmlShutdown)
        self._open = False

    @staticmethod
    def _system(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError):
            return None

    @staticmethod
    def _quiet(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError):
            pass

    # -- one field ----------------------------------------------------------------------------

    def _get(self, dev: _Device, feature: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn(handle, *args)``; None when refused; remember permanent refusals."""
        if feature in dev.unsupported:
            return None
        try:
            return fn(dev.handle, *args)
        except pynvml.NVMLError as exc:
            self._check_lost(dev, exc)
            if exc.value in _PERMANENT:
                dev.unsupported.add(feature)
            return None

    @staticmethod
    def _check_lost(dev: _Device, exc: pynvml.NVMLError) -> None:
        """Raise _Lost when ``exc`` says the GPU is gone. GPU_IS_LOST says so; INVALID_ARGUMENT
        may mean that the handle is no longer a device (NVML documents it as "device is
        invalid"), or only that this query does not apply to the board: a GPU whose UUID, which
        every device has, is refused as well is gone."""
        if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise _Lost from exc
        if exc.value != pynvml.NVML_ERROR_INVALID_ARGUMENT:
            return
        try:
            pynvml.nvmlDeviceGetUUID(dev.handle)
        except pynvml.NVMLError as again:
            if again.value in (pynvml.NVML_ERROR_INVALID_ARGUMENT,
                               pynvml.NVML_ERROR_GPU_IS_LOST):
                raise _Lost from exc

    def _read_static(self, dev: _Device) -> None:
        try:
            dev.name = self._get(dev, "name", pynvml.nvmlDeviceGetName)
            dev.uuid = self._get(dev, "uuid", pynvml.nvmlDeviceGetUUID)
            pci = self._get(dev, "pci", pynvml.nvmlDeviceGetPciInfo_v3)
            if pci is not None:
                bus = pci.busId
                dev.bus_id = bus.decode() if isinstance(bus, bytes) else str(bus)
            s = dev.static
            s["sm_clock_max_mhz"] = self._get(
                dev, "sm_clock_max", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM
            )
            s["mem_clock_max_mhz"] = self._get(
                dev, "mem_clock_max", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_MEM
            )
            s["mem_bus_width_bits"] = self._get(dev, "mem_bus_width",
                                                pynvml.nvmlDeviceGetMemoryBusWidth)
            s["pcie_gen_max"] = self._get(dev, "pcie_gen_max", pynvml.nvmlDeviceGetMaxPcieLinkGeneration)
            s["pcie_width_max"] = self._get(dev, "pcie_width_max", pynvml.nvmlDeviceGetMaxPcieLinkWidth)
            s["minor"] = self._get(dev, "minor", pynvml.nvmlDeviceGetMinorNumber)  # /dev/nvidiaN
        except _Lost:
            dev.lost = True

    # -- versioned calls with fallbacks ---------------------------------------------------------

    def _memory(self, dev: _Device) -> tuple[int | None, int | None, int | None]:
        if "memory_v2" not in dev.unsupported:
            mem = self._get(
                dev, "memory_v2", pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlMemory_v2
            )
            if mem is not None:
                return mem.used, mem.total, mem.reserved
        mem = self._get(dev, "memory", pynvml.nvmlDeviceGetMemoryInfo)
        if mem is None:
            return None, None, None
        return mem.used, mem.total, None

    def _clock_events(self, dev: _Device) -> tuple[str, ...] | None:
        mask = self._get(dev, "clock_events", pynvml.nvmlDeviceGetCurrentClocksEventReasons)
        if mask is None and "clock_events" in dev.unsupported:
            # Drivers before 535 only have the older name of the same call.
            mask = self._get(
                dev, "throttle_reasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            )
        return None if mask is None else decode_clock_events(mask)

    def _processes(self, dev: _Device) -> list[tuple[int, int | None]]:
        procs = None
        if "processes_v3" not in dev.unsupported:
            try:
                procs = self._get(dev, "processes_v3", pynvml.nvmlDeviceGetComputeRunningProcesses)
            except pynvml.NVMLLibraryMismatchError:
                # Not an NVMLError: the library lacks the _v3 symbol. Use _v2 from now on.
                dev.unsupported.add("processes_v3")
        if procs is None and "processes_v3" in dev.unsupported:
            procs = self._get(dev, "processes_v2", pynvml.nvmlDeviceGetComputeRunningProcesses_v2)
        return [(p.pid, p.usedGpuMemory) for p in procs or []]

    def _process_utilization(self, dev: _Device) -> dict[int, float]:
        if "process_utilization" in dev.unsupported:
            return {}
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(dev.handle, dev.proc_util_seen)
        except pynvml.NVMLError as exc:
            self._check_lost(dev, exc)
            if exc.value in _PERMANENT:
                dev.unsupported.add("process_utilization")
            return {}  # NOT_FOUND: no samples since last time
        util: dict[int, float] = {}
        for s in samples:
            dev.proc_util_seen = max(dev.proc_util_seen, s.timeStamp)
            util[s.pid] = max(util.get(s.pid, 0.0), float(s.smUtil))
        return util

    def _prime_gpm(self, dev: _Device) -> None:
        if dev.lost or dev.handle is None:
            return
        try:
            self._gpm(dev)
            self.mig_sample(dev, GPM_METRICS)  # and each MIG GPU instance's
        except _Lost:
            dev.lost = True

    # -- PCIe, read on helper threads ---------------------------------------------------------

    def _read_pcie(self, dev: _Device) -> tuple[int | None, int | None]:
        tx = self._get(dev, "pcie_tx", pynvml.nvmlDeviceGetPcieThroughput,
                       pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._get(dev, "pcie_rx", pynvml.nvmlDeviceGetPcieThroughput,
                       pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return tx, rx

    def start_pcie(self) -> None:
        """Start this tick's PCIe reads (they take the driver 20 ms each)."""
        if self._pcie or not self._open or not self.read_pcie:
            return
        wanted = [d for d in self.devices if not d.lost and not d.pcie_from_gpm
                  and not {"pcie_tx", "pcie_rx"} <= d.unsupported]
        if not wanted:
            return
        if self._pcie_pool is None:
            # The first tick: all GPUs at once, on threads that end once these reads are done
            # (a shutdown that does not wait lets them finish).
            first = min(16, len(wanted))
            self._pcie_first = ThreadPoolExecutor(max_workers=first,
                                                  thread_name_prefix="gputop-pcie")
            self._submit_shares(self._pcie_first, wanted, first)  # all at once, to 16
            self._pcie_first.shutdown(wait=False)
            self._pcie_readers = min(16, -(-len(wanted) // GPUS_PER_READER))
            self._pcie_pool = ThreadPoolExecutor(max_workers=self._pcie_readers,
                                                 thread_name_prefix="gputop-pcie")
            return
        self._submit_shares(self._pcie_pool, wanted, self._pcie_readers)

    def _submit_shares(self, pool: ThreadPoolExecutor, wanted: list[_Device],
                       shares: int) -> None:
        self._pcie = {}
        for n in range(shares):
            share = wanted[n::shares]
            if share:
                future = pool.submit(self._read_pcie_share, share)
                self._pcie.update(dict.fromkeys((d.index for d in share), future))

    def _read_pcie_share(self, devs: list[_Device]) -> dict[int, tuple[int | None, int | None] | _Lost]:
        """One reader's GPUs of a tick, in turn, as one task: the tick's thread then wakes
        once per reader instead of once per GPU (each wake-up, after the 20 ms reads, cost
        ~60 us of CPU: 0.6 ms a tick at 10 GPUs)."""
        out: dict[int, tuple[int | None, int | None] | _Lost] = {}
        for dev in devs:
            try:
                out[dev.index] = self._read_pcie(dev)
            except _Lost as lost:  # this GPU fell off the bus; the others are read
                out[dev.index] = lost
        return out

    def _take_pcie(self, dev: _Device) -> tuple[int | None, int | None]:
        future = self._pcie.pop(dev.index, None)
        if future is None:
            return None, None
        got = future.result().get(dev.index, (None, None))  # its reader's share
        if isinstance(got, _Lost):
            raise got
        return got

    def _gpm(self, dev: _Device) -> dict[str, float | None]:
        empty = dict.fromkeys(DEVICE_GPM_METRICS)
        if "gpm" in dev.unsupported:
            return empty
        if not dev.gpm_checked:
            dev.gpm_checked = True
            support = self._get(dev, "gpm", pynvml.nvmlGpmQueryDeviceSupport)
            if support is None or not support.isSupportedDevice:
                dev.unsupported.add("gpm")
                return empty
        # Two sample buffers per GPU, taken in turn (a reading overwrites the older one):
        # no allocation and free per tick.
        sample, dev.gpm_spare = dev.gpm_spare, None
        try:
            if sample is None:
                sample = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(dev.handle, sample)
        except pynvml.NVMLError as exc:
            if sample is not None:
                self._quiet(pynvml.nvmlGpmSampleFree, sample)
            self._check_lost(dev, exc)
            dev.unsupported.add("gpm")
            return empty
        prev, dev.gpm_prev = dev.gpm_prev, sample
        if prev is None:
            return empty  # GPM metrics are rates between two samples: wait for the next tick
        try:
            return gpm_values(prev, sample, DEVICE_GPM_METRICS)
        finally:
            dev.gpm_spare = prev

    # -- a tick -------------------------------------------------------------------------------

    def sample(self) -> list[_Row]:
        """Per GPU: the sample (without processes), its compute pids with memory, and SM %."""
        self.start_pcie()
        out: list[_Row] = []
        for dev in self.devices:
            if dev.lost:
                out.append((self._lost_sample(dev), [], {}))
                continue
            try:
                out.append(self._sample_device(dev))
            except _Lost:
                dev.lost = True
                log.info("GPU %d fell off the bus", dev.index)
                out.append((self._lost_sample(dev), [], {}))
        # The PCIe readings last: the tick's other reads run in one go, then it waits once
        # (taking each GPU's as it came would wake this thread once per GPU while the readers
        # go through them: +1.3 ms of CPU a tick at 8 GPUs, cold caches after each wait).
        for i, (dev, row) in enumerate(zip(self.devices, out)):
            if dev.lost:
                continue
            try:
                out[i] = self._with_pcie(row, *self._take_pcie(dev))
            except _Lost:
                dev.lost = True
                log.info("GPU %d fell off the bus", dev.index)
                out[i] = (self._lost_sample(dev), [], {})
        pending, self._pcie = self._pcie, {}
        for future in set(pending.values()):  # a GPU lost meanwhile: let its read finish
            future.cancel()
        return out

    @staticmethod
    def _with_pcie(row: _Row, tx: int | None, rx: int | None) -> _Row:
        sample, procs, proc_util = row
        if tx is None and rx is None:
            return row
        # NVML reports PCIe throughput in KB/s.
        sample = evolve(sample, pcie_tx_mbs=None if tx is None else tx / 1000.0,
                        pcie_rx_mbs=None if rx is None else rx / 1000.0)
        return sample, procs, proc_util

    def _slow_fields(self, dev: _Device) -> dict[str, Any]:
        if dev.ticks % SLOW_EVERY == 0 or not dev.slow:
            dev.slow = {
                "power_limit": self._get(dev, "power_limit",
                                         pynvml.nvmlDeviceGetEnforcedPowerLimit),
                "pcie_gen": self._get(dev, "pcie_gen",
                                      pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
                "pcie_width": self._get(dev, "pcie_width",
                                        pynvml.nvmlDeviceGetCurrPcieLinkWidth),
                "fan": self._get(dev, "fan", pynvml.nvmlDeviceGetFanSpeed),
                "mem_clock": self._get(dev, "mem_clock", pynvml.nvmlDeviceGetClockInfo,
                                       pynvml.NVML_CLOCK_MEM),
                "pstate": self._get(dev, "pstate", pynvml.nvmlDeviceGetPerformanceState),
                "ecc": self._get(dev, "ecc", pynvml.nvmlDeviceGetTotalEccErrors,
                                 pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                 pynvml.NVML_VOLATILE_ECC),
                "ecc_corrected": self._get(dev, "ecc_corrected",
                                           pynvml.nvmlDeviceGetTotalEccErrors,
                                           pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                           pynvml.NVML_VOLATILE_ECC),
            }
        dev.ticks += 1
        return dev.slow

    def _lost_sample(self, dev: _Device) -> GpuSample:
        return GpuSample(index=dev.index, uuid=dev.uuid, name=dev.name, bus_id=dev.bus_id, lost=True)

    def _sample_device(self, dev: _Device) -> _Row:
        util = self._get(dev, "utilization", pynvml.nvmlDeviceGetUtilizationRates)
        used, total, reserved = self._memory(dev)
        power_mw = self._get(dev, "power", pynvml.nvmlDeviceGetPowerUsage)
        slow = self._slow_fields(dev)
        limit_mw = slow["power_limit"]
        energy_mj = self._get(dev, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption)
        gpm = self._gpm(dev)
        # From GPM where it counts PCIe; else filled in at the end of the tick (_with_pcie).
        tx_mib, rx_mib = gpm["pcie_tx_mibs"], gpm["pcie_rx_mibs"]
        dev.pcie_from_gpm = tx_mib is not None and rx_mib is not None
        tx = rx = None
        if tx_mib is not None and rx_mib is not None:
            tx, rx = round(tx_mib * MIB / 1e6, 2), round(rx_mib * MIB / 1e6, 2)  # MB/s
        gen, width = slow["pcie_gen"], slow["pcie_width"]
        temp = self._get(dev, "temperature", pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)
        fan = slow["fan"]
        sm_clock = self._get(dev, "sm_clock", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        mem_clock = slow["mem_clock"]
        events = self._clock_events(dev)
        pstate = slow["pstate"]
        ecc, ecc_corrected = slow["ecc"], slow["ecc_corrected"]
        mig_mode, mig, mig_procs = self.mig_sample(dev, GPM_METRICS)
        # With MIG on, the processes are read per MIG device (their GPU instance known).
        procs = mig_procs if mig_mode else self._processes(dev)
        proc_util = self._process_utilization(dev)
        s = dev.static
        sample = GpuSample(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            bus_id=dev.bus_id,
            util_gpu=None if util is None else float(util.gpu),
            util_mem=None if util is None else float(util.memory),
            mem_used=used,
            mem_total=total,
            mem_reserved=reserved,
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
            pcie_tx_mbs=tx,
            pcie_rx_mbs=rx,
            pcie_gen=gen,
            pcie_gen_max=s.get("pcie_gen_max"),
            pcie_width=width,
            pcie_width_max=s.get("pcie_width_max"),
            temperature_c=None if temp is None else float(temp),
            fan_percent=None if fan is None else float(fan),
            sm_clock_mhz=None if sm_clock is None else float(sm_clock),
            sm_clock_max_mhz=s.get("sm_clock_max_mhz"),
            mem_clock_mhz=None if mem_clock is None else float(mem_clock),
            mem_clock_max_mhz=s.get("mem_clock_max_mhz"),
            mem_bus_width_bits=s.get("mem_bus_width_bits"),
            clock_events=events or (),
            pstate=pstate,
            ecc_volatile=None if ecc is None and ecc_corrected is None else (ecc or 0) + (ecc_corrected or 0),
            sm_active=gpm["sm_active"],
            sm_occupancy=gpm["sm_occupancy"],
            tensor_active=gpm["tensor_active"],
            dram_active=gpm["dram_active"],
            mig_mode=mig_mode,
            mig=mig,
        )
        return sample, procs, proc_util

    def minor_numbers(self) -> dict[int, int]:
        """GPU index -> the minor number of its device file (/dev/nvidia<minor>)."""
        return {d.index: d.static["minor"] for d in self.devices
                if isinstance(d.static.get("minor"), int)}
