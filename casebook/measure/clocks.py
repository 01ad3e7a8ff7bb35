"""Clocks: how one sample is timed. Each names itself; the record carries the name.

- ``HostClock``: host ``perf_counter_ns`` around a call and the wait for its output
  (JAX: ``block_until_ready``). The only clock on a CPU.
- ``CudaEventClock``: CUDA events recorded on the runnable's stream before and after
  the call; device time, but launch gaps on that stream are inside it.
- ``CuptiKernelClock``: CUPTI kernel activity for every stream; the sample is the sum
  of the kernels' own durations, and launch overhead (host start to first kernel) and
  gaps are reported beside it, not in it.

Every clock also gives a ``Timing.unseen_s``: device work it saw that finished after
the wait returned or ran on a stream it was not told about (the guards read it), and
names its ``resolution_s``, the smallest step of a reading: no noise floor is finer than
one step of the clock that measured it (``noise``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from casebook.measure import gpu

# Bound once, at import: a measured call that replaces time.perf_counter_ns does not
# reach the clocks (and ``tamper`` refuses the measurement).
now_ns = time.perf_counter_ns


def times_on_host(execution: dict[str, Any]) -> bool:
    """Whether only the host clock can time a runnable of ``execution`` (its contract's
    facts): an interpreter runs it, whatever holds its arrays, or its work runs on the host
    CPU (``device: cpu``). A device clock would count only the device work it happens to
    launch, or none."""
    return bool(execution.get("interpret")) or execution.get("device") == "cpu"

@dataclasses.dataclass(frozen=True)
class Timing:
    seconds: float  # the sample: what this clock measured
    host_s: float  # host wall time from launch to the end of the wait
    kernel_s: float | None = None  # sum of kernel durations (CUPTI only)
    launch_overhead_s: float | None = None  # launch to first kernel start (CUPTI only)
    kernels: int | None = None  # kernels (CUPTI) or programs (a TPU trace) in the sample
    unseen_s: float = 0.0  # device work outside the timed window or stream


Launch = Callable[[], Any]
Wait = Callable[[Any], None]


class HostClock:
    """The host's monotonic clock around the call and the wait for its output."""

    kind = "host"
    description = "host perf_counter_ns around the call and the wait for its output"
    resolution_s = time.get_clock_info("perf_counter").resolution

    def time(self, launch: Launch, wait: Wait) -> tuple[Any, Timing]:
        start = now_ns()
        out = launch()
        wait(out)
        seconds = (now_ns() - start) * 1e-9
        return out, Timing(seconds=seconds, host_s=seconds)

    def close(self) -> None:
        """Nothing to release."""


class CudaEventClock:
    """Start and stop events on ``stream`` (the runnable's own stream handle)."""

    kind = "cuda_event"
    description = "CUDA events on the runnable's stream (device time, launch gaps included)"
    resolution_s = 0.5e-6  # cudaEventElapsedTime: "a resolution of around 0.5 microseconds"

    def __init__(self, tools: gpu.Tools, stream: Any):
        self.tools, self.stream = tools, stream
        cudart = tools.cudart
        self.start = gpu.checked(cudart.cudaEventCreate(), "cudaEventCreate")
        self.stop = gpu.checked(cudart.cudaEventCreate(), "cudaEventCreate")
        self.idle_barrier_s = min(self._barrier_s() for _ in range(5))

    def _barrier_s(self) -> float:
        start = now_ns()
        gpu.synchronize(self.tools)
        return (now_ns() - start) * 1e-9

    def time(self, launch: Launch, wait: Wait) -> tuple[Any, Timing]:
        cudart = self.tools.cudart
        host_start = now_ns()
        gpu.checked(cudart.cudaEventRecord(self.start, self.stream), "cudaEventRecord")
        out = launch()
        gpu.checked(cudart.cudaEventRecord(self.stop, self.stream), "cudaEventRecord")
        wait(out)
        gpu.checked(cudart.cudaEventSynchronize(self.stop), "cudaEventSynchronize")
        host_s = (now_ns() - host_start) * 1e-9
        # Whatever the wait did not cover is still running: the device barrier's cost
        # beyond that of a barrier on an idle device.
        unseen = max(self._barrier_s() - self.idle_barrier_s, 0.0)
        ms = gpu.checked(cudart.cudaEventElapsedTime(self.start, self.stop),
                         "cudaEventElapsedTime")
        return out, Timing(seconds=ms * 1e-3, host_s=host_s, unseen_s=unseen)

    def close(self) -> None:
        for event in (self.start, self.stop):
            gpu.checked(self.tools.cudart.cudaEventDestroy(event), "cudaEventDestroy")


class CuptiKernelClock:
    """CUPTI concurrent-kernel activity, flushed after every sample.

    ``stream_id``: the CUPTI id of the stream the work belongs on, when the runnable
    names one; kernels on any other stream count as unseen. Without it every stream
    counts (JAX picks its own streams), and only work ending after the wait is unseen.
    """

    kind = "cupti_kernel"
    description = ("CUPTI kernel activity: sum of the kernels' own durations, launch "
                   "overhead reported apart")
    # The GPU's global timer that kernel records read: on the H200 here every one-kernel
    # duration was a multiple of 32 ns (3,168 ns, 9,696 ns, 10,400 ns).
    resolution_s = 32e-9
    # CUPTI's activity buffer: 8 MiB holds ~30k kernel records, far more than a sample.
    BUFFER_BYTES = 8 * 2**20

    def __init__(self, tools: gpu.Tools, stream_id: int | None = None):
        if tools.cupti is None:
            raise gpu.GpuUnavailable("cupti-python is not installed (it is in env/cuda.lock)")
        self.tools, self.cupti, self.stream_id = tools, tools.cupti, stream_id
        self.records: list[Any] = []
        self.cupti.activity_register_callbacks(self._requested, self._completed)
        self.cupti.activity_enable(self.cupti.ActivityKind.CONCURRENT_KERNEL)

    def _requested(self) -> tuple[int, int]:
        return self.BUFFER_BYTES, 0  # 0: as many records as fit

    def _completed(self, activities: list[Any]) -> None:
        kernel = int(self.cupti.ActivityKind.CONCURRENT_KERNEL)
        self.records.extend(a for a in activities if int(a.kind) == kernel)

    def time(self, launch: Launch, wait: Wait) -> tuple[Any, Timing]:
        self.records.clear()
        start = self.cupti.get_timestamp()
        out = launch()
        wait(out)
        end = self.cupti.get_timestamp()
        gpu.synchronize(self.tools)  # everything launched has finished before the flush
        self.cupti.activity_flush_all(1)  # 1: forced, so no record waits for a full buffer
        mine = [k for k in self.records if k.start >= start]
        if not mine:
            raise gpu.GpuUnavailable("CUPTI saw no kernel in the sample: nothing ran on "
                                     "the device")
        seen = [k for k in mine if self.stream_id is None or k.stream_id == self.stream_id]
        unseen_ns = sum(k.end - k.start for k in mine if k not in seen or k.end > end)
        kernel_ns = sum(k.end - k.start for k in seen)
        first = min(k.start for k in mine)
        return out, Timing(seconds=kernel_ns * 1e-9, host_s=(end - start) * 1e-9,
                           kernel_s=kernel_ns * 1e-9, launch_overhead_s=(first - start) * 1e-9,
                           kernels=len(seen), unseen_s=unseen_ns * 1e-9)

    def close(self) -> None:
        self.cupti.activity_flush_all(1)
        self.cupti.activity_disable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
        self.cupti.finalize()
