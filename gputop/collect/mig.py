"""MIG devices of a MIG-enabled GPU, read through NVML (a mixin of ``NvmlCollector``).

What NVML gives per MIG device (nvidia-ml-py's MIG calls, as nvitop and DCGM use them):

* the devices: ``nvmlDeviceGetMigMode`` (current, pending), ``nvmlDeviceGetMaxMigDeviceCount``,
  then ``nvmlDeviceGetMigDeviceHandleByIndex`` for each slot (``NOT_FOUND`` for an empty one),
  with ``nvmlDeviceGetGpuInstanceId`` / ``nvmlDeviceGetComputeInstanceId``, and the name
  (``"NVIDIA H100 80GB HBM3 MIG 1g.10gb"``: the profile is its last word) and ``MIG-`` UUID;
* memory: ``nvmlDeviceGetMemoryInfo`` on the MIG handle (the instance's own memory);
* processes: ``nvmlDeviceGetComputeRunningProcesses`` on the MIG handle; the driver may hide
  a process's memory there (``NVML_VALUE_NOT_AVAILABLE``, read as None), and it reports no
  per-process utilization on MIG (``nvmlDeviceGetProcessUtilization``: NOT_SUPPORTED): those
  cells say "n/a (MIG)", never 0;
* activity: no ``nvmlDeviceGetUtilizationRates`` on MIG (NOT_SUPPORTED, on the parent too);
  on Hopper and later GPM samples each GPU instance (``nvmlGpmMigSampleGet(parent, GI id)``),
  which gives SM activity, occupancy, tensor and DRAM activity per instance. Without GPM the
  instance's activity is None ("n/a"), never 0.

The devices are listed when the GPU is opened and again every ``SLOW_EVERY`` samples (an
administrator may create or destroy instances while gputop runs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pynvml

from gputop.core.model import MigSample

_PROFILE = re.compile(r"\bMIG\s+([0-9]+g\.[0-9]+gb(?:\+[a-z]+)?)\b", re.IGNORECASE)


def profile_of(name: str | None) -> str | None:
    """"NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb" (what dcgm-exporter's
    ``GPU_I_PROFILE`` label holds)."""
    m = _PROFILE.search(name or "")
    return m.group(1).lower() if m else None


def gpm_values(prev: Any, sample: Any, metrics: dict[str, int]) -> dict[str, float | None]:
    """GPM ``metrics`` (name -> metric id) between two samples; None where refused."""
    result: dict[str, float | None] = dict.fromkeys(metrics)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    request.sample1, request.sample2 = prev, sample
    for i, metric_id in enumerate(metrics.values()):
        request.metrics[i].metricId = metric_id
    try:
        pynvml.nvmlGpmMetricsGet(request)
    except pynvml.NVMLError:
        return result
    for i, name in enumerate(metrics):
        metric = request.metrics[i]
        if metric.nvmlReturn == pynvml.NVML_SUCCESS:
            result[name] = round(metric.value, 2)
    return result


@dataclass
class _MigDevice:
    slot: int
    sub: Any  # a _Device for the MIG handle: its own capability cache
    gpu_instance: int
    compute_instance: int | None
    name: str | None
    uuid: str | None
    gpm_prev: Any = None
    gpm_spare: Any = None


@dataclass
class MigState:
    mode: bool | None = None  # None: the GPU has no MIG (or does not say)
    devices: list[_MigDevice] = field(default_factory=list)
    listed_at: int = -1  # the parent's tick count when the devices were listed


class MigMixin:
    """MIG reading for ``NvmlCollector``: uses its ``_get``, ``_memory``, ``_processes`` and
    ``_quiet`` on a device object made for each MIG handle. ``dev`` is nvml's ``_Device``
    (Any here: a type-only import back from nvml.py would close an import circle)."""

    if TYPE_CHECKING:  # NvmlCollector's, which this mixin calls
        def _get(self, dev: Any, feature: str, fn: Callable[..., Any], *args: Any) -> Any: ...
        @staticmethod
        def _quiet(fn: Callable[..., Any], *args: Any) -> None: ...
        def _memory(self, dev: Any) -> tuple[int | None, int | None, int | None]: ...
        def _processes(self, dev: Any) -> list[tuple[int, int | None]]: ...

    def _mig_state(self, dev: Any) -> MigState:
        state: MigState | None = dev.static.get("mig")
        if state is None:
            state = dev.static["mig"] = MigState()
        return state

    def _mig_list(self, dev: Any, state: MigState) -> None:
        mode = self._get(dev, "mig_mode", pynvml.nvmlDeviceGetMigMode)
        state.mode = None if mode is None else bool(mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
        old = {d.slot: d for d in state.devices}
        state.devices = []
        if not state.mode:
            self._mig_free(old.values())
            return
        count = self._get(dev, "mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount) or 0
        for slot in range(count):
            # NOT_FOUND for an empty slot (not a lasting refusal: asked again next time).
            handle = self._get(dev, f"mig_slot{slot}", pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                               slot)
            if handle is None:
                continue
            sub = type(dev)(dev.index, handle)
            gi = self._get(sub, "gi", pynvml.nvmlDeviceGetGpuInstanceId)
            if gi is None:
                continue
            known = old.pop(slot, None)
            if known is not None and known.gpu_instance == gi:
                state.devices.append(known)  # the same device: its capability cache kept
                continue
            ci = self._get(sub, "ci", pynvml.nvmlDeviceGetComputeInstanceId)
            name = self._get(sub, "name", pynvml.nvmlDeviceGetName)
            uuid = self._get(sub, "uuid", pynvml.nvmlDeviceGetUUID)
            state.devices.append(_MigDevice(slot, sub, gi, ci, name, uuid))
        self._mig_free(old.values())

    def _mig_free(self, devices: Iterable[_MigDevice]) -> None:
        for d in devices:
            for sample in (d.gpm_prev, d.gpm_spare):
                if sample is not None:
                    self._quiet(pynvml.nvmlGpmSampleFree, sample)
            d.gpm_prev = d.gpm_spare = None

    def _mig_gpm(self, dev: Any, d: _MigDevice, metrics: dict[str, int]) -> dict[str, float | None]:
        """GPM of one GPU instance: two sample buffers taken in turn, as for a whole GPU."""
        empty: dict[str, float | None] = dict.fromkeys(metrics)
        if "gpm" in dev.unsupported or "gpm_mig" in dev.unsupported or not dev.gpm_checked:
            return empty
        sample, d.gpm_spare = d.gpm_spare, None
        got = None
        try:
            if sample is None:
                sample = pynvml.nvmlGpmSampleAlloc()
            # Through ``_get``: a lost GPU raises, a lasting refusal is remembered.
            got = self._get(dev, "gpm_mig", pynvml.nvmlGpmMigSampleGet, d.gpu_instance, sample)
        except pynvml.NVMLLibraryMismatchError:  # a library without the MIG GPM call
            dev.unsupported.add("gpm_mig")
        except pynvml.NVMLError:
            pass  # the sample buffer could not be allocated
        finally:
            if got is None and sample is not None:
                self._quiet(pynvml.nvmlGpmSampleFree, sample)
        if got is None:
            return empty
        prev, d.gpm_prev = d.gpm_prev, sample
        if prev is None:
            return empty
        try:
            return gpm_values(prev, sample, metrics)
        finally:
            d.gpm_spare = prev

    def mig_sample(self, dev: Any, metrics: dict[str, int]
                   ) -> tuple[bool | None, tuple[MigSample, ...], list[tuple[int, int | None]]]:
        """(MIG mode, its MIG devices, the processes on them with their memory)."""
        state = self._mig_state(dev)
        if "mig_mode" in dev.unsupported:
            return None, (), []
        if state.listed_at < 0 or dev.ticks - state.listed_at >= 5:
            self._mig_list(dev, state)  # a lost GPU raises through ``_get``
            state.listed_at = dev.ticks
        if not state.mode:
            return state.mode, (), []
        out: list[MigSample] = []
        procs: list[tuple[int, int | None]] = []
        for d in state.devices:
            used, total, _ = self._memory(d.sub)
            mine = self._processes(d.sub)
            procs.extend(mine)
            gpm = self._mig_gpm(dev, d, metrics)
            out.append(MigSample(
                gpu_instance=d.gpu_instance, compute_instance=d.compute_instance,
                profile=profile_of(d.name), name=d.name, uuid=d.uuid,
                mem_used=used, mem_total=total, sm_active=gpm.get("sm_active"),
                sm_occupancy=gpm.get("sm_occupancy"), tensor_active=gpm.get("tensor_active"),
                dram_active=gpm.get("dram_active"), pids=tuple(pid for pid, _ in mine)))
        return True, tuple(out), procs

    def mig_close(self, dev: Any) -> None:
        state = dev.static.get("mig")
        if state is not None:
            self._mig_free(state.devices)
