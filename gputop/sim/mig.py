"""MIG in the simulated NVML: the C functions a MIG-enabled GPU answers, as a mixin of
``gputop.sim.nvml.SimulatedNvml``.

A GPU whose scenario lists MIG devices (``GpuBehaviour.mig``) is in MIG mode: it answers
``nvmlDeviceGetMigMode`` (1, 1), ``nvmlDeviceGetMaxMigDeviceCount`` (7) and hands out a handle
per MIG device (``nvmlDeviceGetMigDeviceHandleByIndex``) that answers the calls a real MIG
device answers: GPU and compute instance ids, its parent, name ("... MIG 1g.10gb"), ``MIG-``
UUID, its own memory and processes. As on a real driver, neither the MIG device nor its
parent reports utilization (``nvmlDeviceGetUtilizationRates``) or per-process utilization
(``nvmlDeviceGetProcessUtilization``): NOT_SUPPORTED; GPM samples each GPU instance
(``nvmlGpmMigSampleGet``). Other A100/H100-class boards answer MIG mode disabled (0, 0); boards
without MIG answer NOT_SUPPORTED.

Calls reach these through ``route``: the library wrapper asks it first for every call, and it
answers for MIG handles and for the parts of a MIG-mode parent that differ.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from ctypes import POINTER, c_int, c_uint, c_void_p, cast
from dataclasses import dataclass

import pynvml

from gputop.core.boards import BoardTable
from gputop.sim import scenarios
from gputop.sim.base import (
    HANDLE_BASE,
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    put_string,
)
from gputop.sim.base import put as _put

NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value

MIG_HANDLE_BASE = 0x6100_0000  # MIG device handles: base + 0x100 * GPU index + slot
MIG_HANDLE_END = MIG_HANDLE_BASE + 0x100 * 256
# Device calls whose first argument is not a device handle.
_NO_HANDLE = {"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"}
MAX_MIG_DEVICES = 7  # nvmlDeviceGetMaxMigDeviceCount on A100/H100/H200
MIG_BOARDS = ("A100", "A30", "H100", "H200", "H20", "H800", "B200", "GB200")

_P = c_void_p
PROTOTYPES: dict[str, tuple] = {
    "nvmlDeviceGetMigMode": (c_int, _P, _P, _P),
    "nvmlDeviceGetMaxMigDeviceCount": (c_int, _P, _P),
    "nvmlDeviceGetMigDeviceHandleByIndex": (c_int, _P, c_uint, _P),
    "nvmlDeviceIsMigDeviceHandle": (c_int, _P, _P),
    "nvmlDeviceGetGpuInstanceId": (c_int, _P, _P),
    "nvmlDeviceGetComputeInstanceId": (c_int, _P, _P),
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": (c_int, _P, _P),
    "nvmlDeviceGetMinorNumber": (c_int, _P, _P),
    "nvmlGpmMigSampleGet": (c_int, _P, c_uint, _P),
}
# What a MIG device handle answers; anything else on it is NOT_SUPPORTED.
_ON_MIG_HANDLE = {
    "nvmlDeviceGetName": "_mig_name",
    "nvmlDeviceGetUUID": "_mig_uuid",
    "nvmlDeviceGetMemoryInfo": "_mig_memory",
    "nvmlDeviceGetMemoryInfo_v2": "_mig_memory_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3": "_mig_processes",
    "nvmlDeviceGetComputeRunningProcesses_v2": "_mig_processes",
    "nvmlDeviceIsMigDeviceHandle": "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId": "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId": "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
}
# What a MIG-mode parent answers differently.
_ON_MIG_PARENT = {
    "nvmlDeviceGetUtilizationRates": "_not_supported",
    "nvmlDeviceGetProcessUtilization": "_not_supported",
    "nvmlDeviceGetComputeRunningProcesses_v3": "_parent_processes",
    "nvmlDeviceGetComputeRunningProcesses_v2": "_parent_processes",
}


@dataclass(frozen=True)
class _MigBoard:
    pattern: str


_MIG_TABLE = BoardTable(_MigBoard(re.escape(board)) for board in MIG_BOARDS)


def mig_capable(name: str) -> bool:
    """Boards that have MIG (the rest answer NOT_SUPPORTED to the MIG calls)."""
    return _MIG_TABLE.lookup(name) is not None


class SimulatedMig:
    """The MIG part of the simulated driver; expects ``SimulatedNvml``'s state."""

    # -- handles ------------------------------------------------------------------------------

    def _mig_of(self, handle: int | None) -> tuple[int, int, scenarios.MigSlice] | int:
        """(GPU index, slot, slice) of a MIG handle, or an NVML error code."""
        if not _is_mig_handle(handle):
            return INVALID_ARGUMENT
        index, slot = divmod(handle - MIG_HANDLE_BASE, 0x100)
        got = self._gpu(HANDLE_BASE + index)
        if isinstance(got, int):
            return got
        pieces = got[1].mig
        if not 0 <= slot < len(pieces):
            return INVALID_ARGUMENT
        return index, slot, pieces[slot]

    def route(self, name: str, args: tuple) -> Callable | None:
        """The method answering ``name`` for these arguments, when MIG changes it."""
        handle = args[0] if args and name not in _NO_HANDLE else None
        if _is_mig_handle(handle) and name.startswith("nvmlDevice"):
            target = _ON_MIG_HANDLE.get(name, "_not_supported")
            return getattr(self, target)
        if name in _ON_MIG_PARENT and handle is not None:
            got = self._gpu(handle)
            if not isinstance(got, int) and got[1].mig:
                return getattr(self, _ON_MIG_PARENT[name])
        if name == "nvmlGpmSampleGet":
            return self._whole_gpu_sample
        return None

    @staticmethod
    def _not_supported(*_args) -> int:
        return NOT_SUPPORTED

    # -- MIG mode and devices -----------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle, current, pending):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        if not mig_capable(got[1].model.name):
            return NOT_SUPPORTED
        mode = int(bool(got[1].mig))
        _put(current, c_uint, mode)
        _put(pending, c_uint, mode)
        return SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle, out):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        if not mig_capable(got[1].model.name):
            return NOT_SUPPORTED
        _put(out, c_uint, MAX_MIG_DEVICES)
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index, out):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        if not got[1].mig:
            return INVALID_ARGUMENT  # not in MIG mode
        if not 0 <= index < MAX_MIG_DEVICES:
            return INVALID_ARGUMENT
        if index >= len(got[1].mig):
            return NOT_FOUND  # no MIG device in this slot
        _put(out, c_void_p, MIG_HANDLE_BASE + 0x100 * got[0] + index)
        return SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle, out):
        _put(out, c_uint, int(not isinstance(self._mig_of(handle), int)))
        return SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle, out):
        got = self._mig_of(handle)
        if isinstance(got, int):
            return got
        _put(out, c_uint, got[2].gpu_instance)
        return SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle, out):
        got = self._mig_of(handle)
        if isinstance(got, int):
            return got
        _put(out, c_uint, got[2].compute_instance)
        return SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle, out):
        got = self._mig_of(handle)
        if isinstance(got, int):
            return got
        _put(out, c_void_p, HANDLE_BASE + got[0])
        return SUCCESS

    def nvmlDeviceGetMinorNumber(self, handle, out):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        _put(out, c_uint, got[0])  # /dev/nvidia<index>, as on a node with GPUs in bus order
        return SUCCESS

    # -- what a MIG device answers -------------------------------------------------------------

    def _slice_reading(self, index: int, slot: int) -> scenarios.GpuReading:
        # Refreshed every 50 ms as the whole GPU's readings are.
        t = self.clock()
        key = (index, slot, int(t * 20))
        cache = self.__dict__.setdefault("_mig_readings", {})
        cached = cache.get((index, slot))
        if cached is None or cached[0] != key:
            behaviour = self.scenario.gpus[index]
            cached = cache[(index, slot)] = (key, scenarios.mig_slice_reading(
                behaviour, index, slot, t, self.seed))
        return cached[1]

    def _mig_name(self, handle, buf, size):
        got = self._mig_of(handle)
        if isinstance(got, int):
            return got
        name = f"{self.scenario.gpus[got[0]].model.name} MIG {got[2].profile}"
        return put_string(buf, size, name)

    def _mig_uuid(self, handle, buf, size):
        got = self._mig_of(handle)
        if isinstance(got, int):
            return got
        index, slot, piece = got
        return put_string(buf, size, f"MIG-5a1e{self.seed:04x}-{index:04x}-4d3b-9c2e-"
                                    f"00{piece.gpu_instance:04x}{slot:06x}")

    def _mig_memory_of(self, handle, out, struct, versioned: bool):
        got = self._mig_of(handle)
        if isinstance(got, int):
            return got
        index, slot, piece = got
        mem = cast(out, POINTER(struct)).contents
        if versioned:
            if mem.version != pynvml.nvmlMemory_v2:
                return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            mem.reserved = 0
        used = self._slice_reading(index, slot).mem_used
        mem.total, mem.used, mem.free = piece.mem_total, used, piece.mem_total - used
        return SUCCESS

    def _mig_memory(self, handle, out):
        return self._mig_memory_of(handle, out, pynvml.c_nvmlMemory_t, False)

    def _mig_memory_v2(self, handle, out):
        return self._mig_memory_of(handle, out, pynvml.c_nvmlMemory_v2_t, True)

    def _fill_processes(self, count_ptr, array, rows) -> int:
        capacity = cast(count_ptr, POINTER(c_uint))[0]
        _put(count_ptr, c_uint, len(rows))
        if not rows:
            return SUCCESS
        if not array or capacity < len(rows):
            return INSUFFICIENT_SIZE
        infos = cast(array, POINTER(pynvml.c_nvmlProcessInfo_v2_t))
        for i, (pid, memory, gi, ci) in enumerate(rows):
            infos[i].pid = pid
            infos[i].usedGpuMemory = memory
            infos[i].gpuInstanceId = gi
            infos[i].computeInstanceId = ci
        return SUCCESS

    def _slice_rows(self, index: int, slot: int) -> list[tuple[int, int, int, int]]:
        piece = self.scenario.gpus[index].mig[slot]
        with self._lock:
            procs = [p for p in self.processes.get(index, []) if getattr(p, "slot", 0) == slot]
        used = self._slice_reading(index, slot).mem_used
        shares = scenarios.sm_util_share(len(procs))
        return [(p.pid, NOT_AVAILABLE if piece.hide_process_memory else int(used * share),
                 piece.gpu_instance, piece.compute_instance) for p, share in zip(procs, shares)]

    def _mig_processes(self, handle, count_ptr, array):
        got = self._mig_of(handle)
        if isinstance(got, int):
            return got
        return self._fill_processes(count_ptr, array, self._slice_rows(got[0], got[1]))

    def _parent_processes(self, handle, count_ptr, array):
        got = self._gpu(handle)
        if isinstance(got, int):
            return got
        rows = [row for slot in range(len(got[1].mig)) for row in self._slice_rows(got[0], slot)]
        return self._fill_processes(count_ptr, array, rows)

    def mig_place(self, index: int, procs: list) -> list:
        """The processes of a MIG-mode GPU, one per MIG device that runs work (the demo's
        stand-ins and $GPUTOP_DEMO_PIDS, in order); the rest go to the last such device."""
        pieces = self.scenario.gpus[index].mig if index < len(self.scenario.gpus) else ()
        slots = [slot for slot, piece in enumerate(pieces) if piece.standin is not None]
        if not slots:
            return procs
        for n, proc in enumerate(procs):
            proc.slot = slots[min(n, len(slots) - 1)]
        return procs

    # -- GPM per GPU instance ------------------------------------------------------------------

    def nvmlGpmMigSampleGet(self, handle, gpu_instance, sample):
        got = self._field(handle, "gpm")
        if isinstance(got, int):
            return got
        index, gpu, _ = got
        slots = [s for s, piece in enumerate(gpu.mig) if piece.gpu_instance == gpu_instance]
        if not gpu.model.has_gpm:
            return NOT_SUPPORTED
        if not slots:
            return INVALID_ARGUMENT
        with self._lock:
            if sample not in self._gpm_samples:
                return INVALID_ARGUMENT
            self._gpm_samples[sample] = (index, self.clock())
            self.__dict__.setdefault("_gpm_mig", {})[sample] = slots[0]
        return SUCCESS

    def _whole_gpu_sample(self, handle, sample):
        self.__dict__.setdefault("_gpm_mig", {}).pop(sample, None)  # the buffer is the GPU's now
        return type(self).nvmlGpmSampleGet(self, handle, sample)

    def gpm_reading(self, s1: int, s2: int, index: int, t: float
                    ) -> scenarios.GpuReading | None:
        """What two GPM samples of GPU ``index`` compare: the GPU's readings, or a MIG
        device's when both were taken of that GPU instance (None: of different ones)."""
        marks = self.__dict__.get("_gpm_mig", {})
        slot = marks.get(s2)
        if marks.get(s1) != slot:
            return None
        if slot is None:
            return scenarios.reading(self.scenario.gpus[index], index, t, self.seed)
        return scenarios.mig_slice_reading(self.scenario.gpus[index], index, slot, t, self.seed)


def _is_mig_handle(handle) -> bool:
    return isinstance(handle, int) and MIG_HANDLE_BASE <= handle < MIG_HANDLE_END


