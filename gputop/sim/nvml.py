"""A simulated libnvidia-ml under the real nvidia-ml-py bindings.

The bindings call C functions through ``pynvml.nvmlLib``. We set that handle to an object whose
attributes are ``ctypes.CFUNCTYPE`` callables named and typed like the C functions, so every line of
nvidia-ml-py (argument marshalling, struct filling, return codes, exceptions) and of
``collect/nvml.py`` runs exactly as on a real node. Pointer parameters are declared ``c_void_p``
and written through ``cast``; integer and enum parameters use the exact ctypes type the bindings
pass. A symbol the scenario leaves out is simply not an attribute, which the bindings read as a
missing symbol (``NVML_ERROR_FUNCTION_NOT_FOUND``), just as with an older driver.

This is the only fake in gputop: everything above it is the real code.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from ctypes import CFUNCTYPE, POINTER, c_int, c_uint, c_ulonglong, c_void_p, cast

import pynvml

from gputop.sim import scenarios
from gputop.sim.base import (  # noqa: F401  (the return codes are part of this module's face)
    GPU_IS_LOST,
    HANDLE_BASE,
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    LIBRARY_NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    UNINITIALIZED,
    UNKNOWN,
)
from gputop.sim.base import put as _put
from gputop.sim.base import put_string as _put_string
from gputop.sim.mig import PROTOTYPES as MIG_PROTOTYPES
from gputop.sim.mig import SimulatedMig
from gputop.sim.scenarios import GpuBehaviour, Scenario

log = logging.getLogger(__name__)

# A real driver answers nvmlDeviceGetPcieThroughput after counting bytes for 20 ms; the demo
# blocks as long (``pcie_sample_s``), so what a tick costs in time is what it costs on a node.
PCIE_SAMPLE_S = 0.02
GPM_BASE = 0x7700_0000  # fake GPM sample handles


@functools.lru_cache(maxsize=1)
def _pid_max() -> int:  # read once: a driver call does not read /proc
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except OSError:
        return 4_194_304


class SimProcess:
    """A process the simulated driver reports on a GPU: a real pid, or one the host can't see."""

    def __init__(self, pid: int, mem_share: float) -> None:
        self.pid = pid
        self.mem_share = mem_share
        self.slot = 0  # the MIG device it runs on, on a MIG-mode GPU


class SimulatedNvml(SimulatedMig):
    """The state of one simulated driver: scenario, clock, and the pids on each GPU."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        pcie_sample_s: float = 0.0,
        elapsed: float = 0.0,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.pcie_sample_s = pcie_sample_s
        # ``elapsed``: how long the simulated jobs have run when the driver opens (a one-shot
        # snapshot reads them past their start-up, as on a node where they already ran).
        start = time.monotonic() - elapsed
        self.clock = clock or (lambda: time.monotonic() - start)
        # time.monotonic() at the clock's zero (None for a clock of the caller's): stand-ins
        # that follow the simulated GPU's phases read it.
        self.origin: float | None = None if clock else start
        self._lock = threading.Lock()
        self.processes: dict[int, list[SimProcess]] = {i: [] for i in range(len(scenario.gpus))}
        self._energy = [(0.0, 0.0) for _ in scenario.gpus]  # (last t, joules)
        self._gpm_samples: dict[int, tuple[int, float]] = {}
        self._next_gpm = GPM_BASE
        self._strings: dict[int, ctypes.Array] = {}
        self._readings: dict[int, tuple[tuple[int, int], scenarios.GpuReading]] = {}
        self._initialized = 0
        self.calls: Counter[str] = Counter()  # C calls made, by name (tests, benchmarks)
        # Faults a test turns on mid-run: every call on a GPU's handle answers this code (a GPU
        # whose handle the driver no longer knows answers INVALID_ARGUMENT), or a C function
        # answers it whatever its arguments (a system query an old driver does not support).
        self.gpu_faults: dict[int, int] = {}
        self.call_faults: dict[str, int] = {}
        hidden = _pid_max()
        for i, gpu in enumerate(scenario.gpus):
            for k in range(gpu.extra_pids):
                self.processes[i].append(SimProcess(hidden + 100 * i + k, 0.15))

    # -- wiring -----------------------------------------------------------------------------

    def set_processes(self, index: int, pids: list[int]) -> None:
        """Report these real pids as compute processes of GPU ``index`` (set by the demo)."""
        with self._lock:
            keep = [p for p in self.processes.get(index, []) if p.pid >= _pid_max()]
            shares = scenarios.sm_util_share(len(pids))
            placed = [SimProcess(pid, s) for pid, s in zip(pids, shares)]
            self.processes[index] = self.mig_place(index, placed) + keep

    def _gpu(self, handle: int | None) -> tuple[int, GpuBehaviour] | int:
        """The GPU of a handle, or an NVML error code for a bad or lost one."""
        if handle is None:
            return INVALID_ARGUMENT
        index = handle - HANDLE_BASE
        if not 0 <= index < len(self.scenario.gpus):
            return INVALID_ARGUMENT
        gpu = self.scenario.gpus[index]
        if scenarios.is_lost(gpu, self.clock()):
            return GPU_IS_LOST
        fault = self.gpu_faults.get(index)
        if fault is not None:
            return fault
        return index, gpu

    def _reading(self, index: int, gpu: GpuBehaviour) -> scenarios.GpuReading:
        # A real driver refreshes its counters every few tens of ms: so do we, which also
        # keeps the ~20 calls of one sampling tick consistent with each other.
        t = self.clock()
        key = (index, int(t * 20))
        cached = self._readings.get(index)
        if cached is None or cached[0] != key:
            cached = self._readings[index] = (key, scenarios.reading(gpu, index, t, self.seed))
        return cached[1]

    # -- the C functions --------------------------------------------------------------------
    # Each returns an nvmlReturn_t. They are wrapped by `_export`, which turns any Python error
    # into NVML_ERROR_UNKNOWN so nothing is ever raised through the C boundary.

    def nvmlInitWithFlags(self, flags):
        if self.scenario.no_driver:
            return LIBRARY_NOT_FOUND
        self._initialized += 1
        return SUCCESS

    def nvmlInit_v2(self):
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self):
        if self._initialized == 0:
            return UNINITIALIZED
        self._initialized -= 1
        return SUCCESS

    def nvmlErrorString(self, result):
        # The bindings read the result as `char *`: return a buffer that outlives the call.
        buf = self._strings.get(result)
        if buf is None:
            text = pynvml.NVMLError._errcode_to_string.get(result, f"Unknown error {result}")
            buf = self._strings[result] = ctypes.create_string_buffer(text.encode())
        return ctypes.addressof(buf)

    def nvmlSystemGetDriverVersion(self, buf, size):
        return _put_string(buf, size, self.scenario.driver_version)

    def nvmlSystemGetNVMLVersion(self, buf, size):
        major = self.scenario.cuda_version // 1000
        return _put_string(buf, size, f"{major}.{self.scenario.driver_version}")

    def nvmlSystemGetCudaDriverVersion(self, out):
        _put(out, c_int, self.scenario.cuda_version)
        return SUCCESS

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlDeviceGetCount_v2(self, out):
        _put(out, c_uint, len(self.scenario.gpus))
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index, out):
        if not 0 <= index < len(self.scenario.gpus):
            return INVALID_ARGUMENT
        _put(out, c_void_p, HANDLE_BASE + index)
        return SUCCESS

    def nvmlDeviceGetName(self, handle, buf, size):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        return _put_string(buf, size, got[1].model.name)

    def nvmlDeviceGetUUID(self, handle, buf, size):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        index = got[0]
        return _put_string(
            buf, size, f"GPU-5a1e{self.seed:04x}-{index:04x}-4d3b-9c2e-0000000{index:05d}"
        )

    def nvmlDeviceGetPciInfo_v3(self, handle, out):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        index, gpu = got
        info = cast(out, POINTER(pynvml.nvmlPciInfo_t)).contents
        # A bus number fits in a byte: past 14 GPUs (bench_sampling's 64) the device number
        # moves on instead.
        bus, device = 0x18 + 0x10 * (index % 14), index // 14
        bus_id = f"00000000:{bus:02X}:{device:02X}.0".encode()
        info.busIdLegacy = bus_id
        info.busId = bus_id
        info.domain, info.bus, info.device = 0, bus, device
        info.pciDeviceId = gpu.model.pci_device_id
        info.pciSubSystemId = 0x16A110DE
        return SUCCESS

    def _field(self, handle, feature: str | None = None):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        index, gpu = got
        if feature is not None and feature in gpu.unsupported:
            return NOT_SUPPORTED
        return index, gpu, self._reading(index, gpu)

    def nvmlDeviceGetUtilizationRates(self, handle, out):
        got = self._field(handle)
        if isinstance(got, int):
            return got
        util = cast(out, POINTER(pynvml.c_nvmlUtilization_t)).contents
        util.gpu, util.memory = int(got[2].util_gpu), int(got[2].util_mem)
        return SUCCESS

    def _memory(self, handle, out, struct, versioned: bool):
        got = self._field(handle)
        if isinstance(got, int):
            return got
        _, gpu, r = got
        mem = cast(out, POINTER(struct)).contents
        if versioned:
            if mem.version != pynvml.nvmlMemory_v2:
                return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            mem.reserved = gpu.model.mem_reserved
        mem.total = gpu.model.mem_total
        mem.used = r.mem_used
        mem.free = gpu.model.mem_total - r.mem_used - (gpu.model.mem_reserved if versioned else 0)
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle, out):
        return self._memory(handle, out, pynvml.c_nvmlMemory_t, versioned=False)

    def nvmlDeviceGetMemoryInfo_v2(self, handle, out):
        return self._memory(handle, out, pynvml.c_nvmlMemory_v2_t, versioned=True)

    def nvmlDeviceGetPowerUsage(self, handle, out):
        got = self._field(handle, "power")
        if isinstance(got, int):
            return got
        _put(out, c_uint, int(got[2].power_w * 1000))
        return SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle, out):
        got = self._field(handle, "power")
        if isinstance(got, int):
            return got
        _put(out, c_uint, int(got[1].model.power_limit_w * 1000))
        return SUCCESS

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, out):
        got = self._field(handle, "energy")
        if isinstance(got, int):
            return got
        index, _, r = got
        with self._lock:
            last_t, joules = self._energy[index]
            now = self.clock()
            joules += r.power_w * max(0.0, now - last_t)
            self._energy[index] = (now, joules)
        _put(out, c_ulonglong, int(joules * 1000))
        return SUCCESS

    def nvmlDeviceGetPcieThroughput(self, handle, counter, out):
        got = self._field(handle, "pcie_throughput")
        if isinstance(got, int):
            return got
        if self.pcie_sample_s:
            time.sleep(self.pcie_sample_s)  # the driver's byte-counting window
        r = got[2]
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            _put(out, c_uint, int(r.pcie_tx_kbs))
        elif counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            _put(out, c_uint, int(r.pcie_rx_kbs))
        else:
            return INVALID_ARGUMENT
        return SUCCESS

    def _uint(self, handle, out, value_of, feature: str | None = None):
        got = self._field(handle, feature)
        if isinstance(got, int):
            return got
        _put(out, c_uint, int(value_of(got[1], got[2])))
        return SUCCESS

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle, out):
        return self._uint(handle, out, lambda g, r: r.pcie_gen)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle, out):
        return self._uint(handle, out, lambda g, r: g.model.pcie_gen_max)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle, out):
        return self._uint(handle, out, lambda g, r: g.model.pcie_width_max)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle, out):
        return self._uint(handle, out, lambda g, r: g.model.pcie_width_max)

    def nvmlDeviceGetTemperature(self, handle, sensor, out):
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            return INVALID_ARGUMENT
        return self._uint(handle, out, lambda g, r: r.temperature_c)

    def nvmlDeviceGetFanSpeed(self, handle, out):
        got = self._field(handle)
        if isinstance(got, int):
            return got
        if not got[1].model.has_fan:
            return NOT_SUPPORTED  # SXM boards are cooled by the chassis
        _put(out, c_uint, int(got[2].fan_percent))
        return SUCCESS

    def nvmlDeviceGetClockInfo(self, handle, clock_type, out):
        if clock_type == pynvml.NVML_CLOCK_SM:
            return self._uint(handle, out, lambda g, r: r.sm_clock)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return self._uint(handle, out, lambda g, r: r.mem_clock)
        return NOT_SUPPORTED

    def nvmlDeviceGetMaxClockInfo(self, handle, clock_type, out):
        if clock_type == pynvml.NVML_CLOCK_SM:
            return self._uint(handle, out, lambda g, r: g.model.sm_clock_max)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return self._uint(handle, out, lambda g, r: g.model.mem_clock_max)
        return NOT_SUPPORTED

    def nvmlDeviceGetMemoryBusWidth(self, handle, out):
        got = self._field(handle, "mem_bus_width")
        if isinstance(got, int):
            return got
        if not got[1].model.mem_bus_width:
            return NOT_SUPPORTED
        return self._uint(handle, out, lambda g, r: g.model.mem_bus_width)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle, out):
        got = self._field(handle, "clock_events")
        if isinstance(got, int):
            return got
        _put(out, c_ulonglong, got[2].clock_events)
        return SUCCESS

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, out):
        # The older name of the same call; old boards do answer this one.
        got = self._field(handle)
        if isinstance(got, int):
            return got
        _put(out, c_ulonglong, got[2].clock_events)
        return SUCCESS

    def nvmlDeviceGetPerformanceState(self, handle, out):
        return self._uint(handle, out, lambda g, r: r.pstate)

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type, out):
        got = self._field(handle)
        if isinstance(got, int):
            return got
        volatile = counter_type == pynvml.NVML_VOLATILE_ECC
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        count = got[2].ecc_volatile if (volatile and corrected) else 0
        _put(out, c_ulonglong, count)
        return SUCCESS

    def _running_processes(self, handle, count_ptr, array):
        got = self._field(handle)
        if isinstance(got, int):
            return got
        index, gpu, r = got
        with self._lock:
            procs = list(self.processes.get(index, []))
        # No MIG: the instance ids are NVML's "not set" (0xFFFFFFFF).
        rows = [(p.pid, int(r.mem_used * p.mem_share), 0xFFFFFFFF, 0xFFFFFFFF) for p in procs]
        return self._fill_processes(count_ptr, array, rows)

    nvmlDeviceGetComputeRunningProcesses_v3 = _running_processes
    nvmlDeviceGetComputeRunningProcesses_v2 = _running_processes

    def nvmlDeviceGetProcessUtilization(self, handle, array, count_ptr, last_seen):
        got = self._field(handle, "process_utilization")
        if isinstance(got, int):
            return got
        index, _, r = got
        with self._lock:
            procs = [p for p in self.processes.get(index, []) if p.pid < _pid_max()]
        capacity = cast(count_ptr, POINTER(c_uint))[0]
        _put(count_ptr, c_uint, len(procs))
        if not procs:
            return pynvml.NVML_ERROR_NOT_FOUND  # what the driver says with no samples
        if not array or capacity < len(procs):
            return INSUFFICIENT_SIZE
        samples = cast(array, POINTER(pynvml.c_nvmlProcessUtilizationSample_t))
        stamp = int(time.time() * 1e6)
        for i, (proc, share) in enumerate(zip(procs, scenarios.sm_util_share(len(procs)))):
            samples[i].pid = proc.pid
            samples[i].timeStamp = stamp
            samples[i].smUtil = int(r.util_gpu * share)
            samples[i].memUtil = int(r.util_mem * share)
            samples[i].encUtil = samples[i].decUtil = 0
        return SUCCESS

    def nvmlGpmQueryDeviceSupport(self, handle, out):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        support = cast(out, POINTER(pynvml.c_nvmlGpmSupport_t)).contents
        gpu = got[1]
        support.isSupportedDevice = int(gpu.model.has_gpm and "gpm" not in gpu.unsupported)
        return SUCCESS

    def nvmlGpmSampleAlloc(self, out):
        with self._lock:
            self._next_gpm += 0x40
            handle = self._next_gpm
            self._gpm_samples[handle] = (-1, 0.0)
        _put(out, c_void_p, handle)
        return SUCCESS

    def nvmlGpmSampleFree(self, sample):
        with self._lock:
            return SUCCESS if self._gpm_samples.pop(sample, None) else INVALID_ARGUMENT

    def nvmlGpmSampleGet(self, handle, sample):
        got = self._field(handle, "gpm")
        if isinstance(got, int):
            return got
        if not got[1].model.has_gpm:
            return NOT_SUPPORTED
        with self._lock:
            if sample not in self._gpm_samples:
                return INVALID_ARGUMENT
            self._gpm_samples[sample] = (got[0], self.clock())
        return SUCCESS

    def nvmlGpmMetricsGet(self, out):
        request = cast(out, POINTER(pynvml.c_nvmlGpmMetricsGet_t)).contents
        s1 = cast(request.sample1, c_void_p).value
        s2 = cast(request.sample2, c_void_p).value
        with self._lock:
            first, second = self._gpm_samples.get(s1), self._gpm_samples.get(s2)
        if first is None or second is None or first[0] < 0 or first[0] != second[0]:
            return INVALID_ARGUMENT
        index = first[0]
        r = self.gpm_reading(s1, s2, index, second[1])  # the GPU's, or a MIG device's
        if r is None:
            return INVALID_ARGUMENT
        values = {
            pynvml.NVML_GPM_METRIC_SM_UTIL: r.sm_active,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: r.sm_occupancy,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: r.tensor_active,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: r.dram_active,
            # GPM counts PCIe in MiB/s over the samples' interval (the legacy read: KB/s).
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: r.pcie_tx_kbs * 1000 / scenarios.MIB,
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: r.pcie_rx_kbs * 1000 / scenarios.MIB,
        }
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in values:
                metric.value = float(values[metric.metricId])
                metric.nvmlReturn = SUCCESS
            else:
                metric.nvmlReturn = NOT_SUPPORTED
        return SUCCESS


# name -> ctypes prototype (return type first), as in nvml.h.
_P = c_void_p
PROTOTYPES: dict[str, tuple] = {
    "nvmlInitWithFlags": (c_int, c_uint),
    "nvmlInit_v2": (c_int,),
    "nvmlShutdown": (c_int,),
    "nvmlErrorString": (c_void_p, c_int),
    "nvmlSystemGetDriverVersion": (c_int, _P, c_uint),
    "nvmlSystemGetNVMLVersion": (c_int, _P, c_uint),
    "nvmlSystemGetCudaDriverVersion": (c_int, _P),
    "nvmlSystemGetCudaDriverVersion_v2": (c_int, _P),
    "nvmlDeviceGetCount_v2": (c_int, _P),
    "nvmlDeviceGetHandleByIndex_v2": (c_int, c_uint, _P),
    "nvmlDeviceGetName": (c_int, _P, _P, c_uint),
    "nvmlDeviceGetUUID": (c_int, _P, _P, c_uint),
    "nvmlDeviceGetPciInfo_v3": (c_int, _P, _P),
    "nvmlDeviceGetUtilizationRates": (c_int, _P, _P),
    "nvmlDeviceGetMemoryInfo": (c_int, _P, _P),
    "nvmlDeviceGetMemoryInfo_v2": (c_int, _P, _P),
    "nvmlDeviceGetPowerUsage": (c_int, _P, _P),
    "nvmlDeviceGetEnforcedPowerLimit": (c_int, _P, _P),
    "nvmlDeviceGetTotalEnergyConsumption": (c_int, _P, _P),
    "nvmlDeviceGetPcieThroughput": (c_int, _P, c_uint, _P),
    "nvmlDeviceGetCurrPcieLinkGeneration": (c_int, _P, _P),
    "nvmlDeviceGetMaxPcieLinkGeneration": (c_int, _P, _P),
    "nvmlDeviceGetCurrPcieLinkWidth": (c_int, _P, _P),
    "nvmlDeviceGetMaxPcieLinkWidth": (c_int, _P, _P),
    "nvmlDeviceGetTemperature": (c_int, _P, c_uint, _P),
    "nvmlDeviceGetFanSpeed": (c_int, _P, _P),
    "nvmlDeviceGetClockInfo": (c_int, _P, c_uint, _P),
    "nvmlDeviceGetMaxClockInfo": (c_int, _P, c_uint, _P),
    "nvmlDeviceGetMemoryBusWidth": (c_int, _P, _P),
    "nvmlDeviceGetCurrentClocksEventReasons": (c_int, _P, _P),
    "nvmlDeviceGetCurrentClocksThrottleReasons": (c_int, _P, _P),
    "nvmlDeviceGetPerformanceState": (c_int, _P, _P),
    "nvmlDeviceGetTotalEccErrors": (c_int, _P, c_uint, c_uint, _P),
    "nvmlDeviceGetComputeRunningProcesses_v3": (c_int, _P, _P, _P),
    "nvmlDeviceGetComputeRunningProcesses_v2": (c_int, _P, _P, _P),
    "nvmlDeviceGetProcessUtilization": (c_int, _P, _P, _P, c_ulonglong),
    "nvmlGpmQueryDeviceSupport": (c_int, _P, _P),
    "nvmlGpmSampleAlloc": (c_int, _P),
    "nvmlGpmSampleFree": (c_int, _P),
    "nvmlGpmSampleGet": (c_int, _P, _P),
    "nvmlGpmMetricsGet": (c_int, _P),
    **MIG_PROTOTYPES,  # MIG calls (sim/mig.py)
}


class _Library:
    """Stands where ``CDLL("libnvidia-ml.so.1")`` would; unset attributes are missing symbols."""


def _export(sim: SimulatedNvml, name: str, restype) -> Callable:
    method = getattr(sim, name)

    def call(*args):
        sim.calls[name] += 1
        fault = sim.call_faults.get(name)
        if fault is not None:
            return fault
        try:
            return (sim.route(name, args) or method)(*args)  # MIG answers some calls
        except Exception:  # never raise through the C boundary
            log.exception("simulated %s failed", name)
            return 0 if restype is c_void_p else UNKNOWN

    return call


def build_library(sim: SimulatedNvml) -> _Library:
    lib = _Library()
    for name, (restype, *argtypes) in PROTOTYPES.items():
        if name in sim.scenario.missing_symbols:
            continue
        prototype = CFUNCTYPE(restype, *argtypes)
        setattr(lib, name, prototype(_export(sim, name, restype)))
    return lib


_installed: SimulatedNvml | None = None


def install(sim: SimulatedNvml) -> SimulatedNvml:
    """Put ``sim`` behind the nvidia-ml-py bindings of this process (before ``nvmlInit``)."""
    global _installed
    with pynvml.libLoadLock:
        pynvml.nvmlLib = build_library(sim)
        pynvml._nvmlGetFunctionPointer_cache.clear()
    _installed = sim
    return sim


def uninstall() -> None:
    """Forget the simulated library; the next ``nvmlInit`` looks for the real one again."""
    global _installed
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
    _installed = None


def installed() -> SimulatedNvml | None:
    return _installed
