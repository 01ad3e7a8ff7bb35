"""Fakes of cuda-python's runtime, NVML and CUPTI, passed in where the engine takes tools,
and a host clock that reads booked durations (``BOOKED``).

They keep a simulated device clock: a kernel launched on a stream advances that stream's
time by its duration; events and CUPTI records read it. Nothing is monkeypatched.
"""

from __future__ import annotations

import enum
import itertools
import time
import types
from collections.abc import Iterator
from typing import Any

from casebook.measure import clocks, engine

OK = 0
LAUNCH_NS = 500  # simulated launch latency: host launch to kernel start


class Device:
    """A device that runs kernels instantly in host time but books their duration."""

    def __init__(self):
        self.now_ns = 1_000_000
        self.kernels: list[types.SimpleNamespace] = []
        self.pending_host_s = 0.0  # side-stream work a barrier still has to wait for
        self.memsets: list[int] = []
        self.limits: dict[str, int] = {}
        self.persisting_resets = 0

    def launch(self, duration_ns: int, stream: int = 1, late_ns: int = 0) -> None:
        """A kernel on ``stream``; ``late_ns`` > 0 makes it end after the host's wait."""
        start = self.now_ns + LAUNCH_NS
        end = start + duration_ns
        self.kernels.append(types.SimpleNamespace(
            kind=CuptiKind.CONCURRENT_KERNEL, start=start, end=end + late_ns,
            stream_id=stream, name="k", correlation_id=len(self.kernels)))
        if stream == 1:
            self.now_ns = end


class CudaAttr(enum.IntEnum):
    cudaDevAttrL2CacheSize = 38


class CudaLimit(enum.IntEnum):
    cudaLimitPersistingL2CacheSize = 6


class Cudart:
    cudaDeviceAttr = CudaAttr
    cudaLimit = CudaLimit

    def __init__(self, device: Device, l2_bytes: int = 50 * 2**20):
        self.device, self.l2_bytes = device, l2_bytes
        self.events: dict[int, int] = {}
        self.ids: Iterator[int] = itertools.count(1)
        self.freed: list[int] = []

    def cudaEventCreate(self):
        return OK, next(self.ids)

    def cudaEventRecord(self, event, stream):
        self.events[event] = self.device.now_ns
        return (OK,)

    def cudaEventSynchronize(self, event):
        return (OK,)

    def cudaEventElapsedTime(self, start, stop):
        return OK, (self.events[stop] - self.events[start]) / 1e6

    def cudaEventDestroy(self, event):
        return (OK,)

    def cudaDeviceSynchronize(self):
        if self.device.pending_host_s:  # sleep(0) would yield the CPU: ms on a busy host
            time.sleep(self.device.pending_host_s)
        self.device.pending_host_s = 0.0
        return (OK,)

    def cudaDeviceGetAttribute(self, attr, device):
        assert attr == CudaAttr.cudaDevAttrL2CacheSize
        return OK, self.l2_bytes

    def cudaMalloc(self, size):
        return OK, 0xBEEF

    def cudaMemsetAsync(self, ptr, value, size, stream):
        self.device.memsets.append(size)
        return (OK,)

    def cudaDeviceSetLimit(self, limit, value):
        self.device.limits[CudaLimit(limit).name] = value
        return (OK,)

    def cudaCtxResetPersistingL2Cache(self):
        self.device.persisting_resets += 1
        return (OK,)

    def cudaFree(self, ptr):
        self.freed.append(ptr)
        return (OK,)


class CuptiKind(enum.IntEnum):
    CONCURRENT_KERNEL = 10


class Cupti:
    ActivityKind = CuptiKind

    def __init__(self, device: Device):
        self.device = device
        self.completed = None
        self.enabled: set[int] = set()
        self.finalized = False

    def activity_register_callbacks(self, requested, completed):
        assert requested() == (8 * 2**20, 0)
        self.completed = completed

    def activity_enable(self, kind):
        self.enabled.add(int(kind))

    def activity_disable(self, kind):
        self.enabled.discard(int(kind))

    def get_timestamp(self) -> int:
        return self.device.now_ns

    def activity_flush_all(self, flag):
        records, self.device.kernels = self.device.kernels, []
        if int(CuptiKind.CONCURRENT_KERNEL) in self.enabled:
            self.completed(records)

    def finalize(self):
        self.finalized = True


class Nvml:
    NVML_CLOCK_SM = 0
    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwSlowdown = 0x8
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80

    def __init__(self, readings: list[tuple[int, int]], max_mhz: int = 1980):
        self.readings, self.max_mhz, self.current = iter(readings), max_mhz, (0, max_mhz)

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return self.max_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        self.current = next(self.readings, (0, self.max_mhz))
        return self.current[0]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self.current[1]


def tools(device: Device, nvml: Nvml | None = None, cupti: bool = True) -> Any:
    from casebook.measure import gpu

    return gpu.Tools(cudart=Cudart(device), nvml=nvml or Nvml([]),
                     cupti=Cupti(device) if cupti else None)


class BookedTime:
    """A host clock that reads the duration the last call booked (``BookedTime.last``),
    not the time it took: no preemption of a loaded test machine moves a sample."""

    kind = "host"
    description = "the time each call booked"
    resolution_s = 1e-9
    last = 0.0

    def time(self, launch, wait):
        out = launch()
        wait(out)
        return out, clocks.Timing(seconds=self.last, host_s=self.last)

    def close(self) -> None:
        """Nothing to release."""


class Booked(engine.Devices):
    """A host without a GPU whose every measurement reads ``BookedTime``."""

    def clock(self, wanted, runnable):
        return BookedTime()


BOOKED = Booked(None, "no GPU: test")
