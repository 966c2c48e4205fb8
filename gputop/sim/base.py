"""What the simulated driver (``nvml``) and its MIG part (``mig``) share: the return codes,
the device handle range and the writers into the caller's C buffers. Both import this module;
neither imports the other's internals, so the import arrows run one way (nvml -> mig -> base).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, cast

import pynvml

SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN

HANDLE_BASE = 0x5100  # fake device handles are HANDLE_BASE + index


def put(ptr: int, ctype, value) -> None:
    """Write one C value where the caller's pointer points."""
    cast(ptr, POINTER(ctype))[0] = value


def put_string(buf: int, size: int, text: str) -> int:
    """Write a NUL-terminated string into the caller's buffer, or say it is too small."""
    data = text.encode() + b"\0"
    if len(data) > size:
        return INSUFFICIENT_SIZE
    ctypes.memmove(buf, data, len(data))
    return SUCCESS
