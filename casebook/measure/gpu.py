"""The GPU's libraries, found or reported absent: cuda-python, NVML, CUPTI.

Nothing here runs without a driver; every function either returns what it found or
raises ``GpuUnavailable`` with the reason, which the record then states ("no GPU: ...").
The libraries are passed in wherever they are used, so tests hand in fakes.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class GpuUnavailable(RuntimeError):
    """No usable GPU, driver or profiling library: the reason, in words."""


def checked(result: Any, what: str) -> Any:
    """A cuda-python result tuple ``(err, *values)`` -> values; an error raises."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise GpuUnavailable(f"{what} failed: {getattr(err, 'name', err)}")
    return values[0] if len(values) == 1 else tuple(values)


@dataclasses.dataclass(frozen=True)
class Tools:
    """The device libraries of one GPU host, and which device is measured."""

    cudart: Any
    nvml: Any
    cupti: Any | None  # None: CUPTI not installed here (only in env/cuda.lock)
    device: int = 0


def load_cupti() -> Any | None:
    try:
        from cupti import cupti
    except ImportError:
        return None
    return cupti


def find(device: int = 0) -> Tools:
    """The tools for ``device``, or GpuUnavailable saying why there are none."""
    try:
        import pynvml
        from cuda.bindings import runtime as cudart
    except ImportError as error:  # a TPU host's bundle carries neither
        raise GpuUnavailable(f"the GPU's libraries are not installed ({error})") from None

    try:
        count = checked(cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
    except RuntimeError as error:  # cuda-python raises RuntimeError subclasses
        raise GpuUnavailable(f"CUDA runtime unavailable ({error})") from None
    if count <= device:
        raise GpuUnavailable(f"no CUDA device {device} ({count} found)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise GpuUnavailable(f"NVML unavailable ({error})") from None
    return Tools(cudart=cudart, nvml=pynvml, cupti=load_cupti(), device=device)


def l2_cache_bytes(tools: Tools) -> int:
    return int(checked(tools.cudart.cudaDeviceGetAttribute(
        tools.cudart.cudaDeviceAttr.cudaDevAttrL2CacheSize, tools.device),
        "cudaDeviceGetAttribute(L2CacheSize)"))


def synchronize(tools: Tools) -> None:
    """Wait for all work on every stream of the device."""
    checked(tools.cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
