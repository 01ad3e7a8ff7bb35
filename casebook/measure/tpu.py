"""The TPU's device clock: jax's profiler trace, read without any server.

``jax.profiler.start_trace`` / ``stop_trace`` write an XSpace (``*.xplane.pb``), and
``jax.profiler.ProfileData`` reads it in-process. On the plane of the measured chip
(``/device:TPU:<n>``) the line ``XLA Modules`` holds one event per executed program (a
jitted call) with its device start and duration; ``XLA Ops`` splits each into its HLO
ops (a Pallas kernel is one custom call). A sample's device time is the sum of the
modules that ran in its trace, as CUPTI's is the sum of kernels: gaps between programs,
and the host's launch and wait, are not in it (the host time is reported beside it).

Facts seen on a TPU v5e (jax 0.10.2; docs/tpu.md): a start and stop of the trace cost
about 0.04 s and 0.25 s of wall time, outside the sample; module durations are given in
picoseconds (``device_duration_ps``) and repeat to 0.1% or better.

``modules`` reads a trace (numpy-free, hardware-free: tests read a committed trace of
the TPU), ``find`` says whether this process's jax runs on a TPU, ``TraceClock`` times.
"""

from __future__ import annotations

import dataclasses
import glob
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from casebook.measure import clocks

MODULES_LINE = "XLA Modules"
DEVICE_PLANE = "/device:TPU:{}"
# Samples timed in one trace (TraceClock.time_many): a trace's start and read, 0.3 s,
# paid once for all of them instead of once a sample.
SAMPLES_PER_TRACE = 8


class TpuUnavailable(RuntimeError):
    """No TPU under this process's jax: the reason, in words."""


@dataclasses.dataclass(frozen=True)
class Module:
    """One executed program on the device: its name (``jit_<fn>(<fingerprint>)``), start
    (ns, the trace's device time base) and duration (s)."""

    name: str
    start_ns: float
    seconds: float


def _seconds(event: Any) -> float:
    """An event's duration: its picosecond stat where the trace has one."""
    stats = dict(event.stats)
    picoseconds = stats.get("device_duration_ps")
    return float(picoseconds) * 1e-12 if picoseconds is not None else event.duration_ns * 1e-9


def modules(profile: Any, device: int = 0) -> list[Module]:
    """The programs executed on TPU ``device`` in ``profile`` (a ``ProfileData``), in
    start order; a trace without that device's plane raises TpuUnavailable."""
    wanted = DEVICE_PLANE.format(device)
    for plane in list(profile.planes):
        if plane.name == wanted:
            found = [Module(e.name, e.start_ns, _seconds(e))
                     for line in list(plane.lines) if line.name == MODULES_LINE
                     for e in list(line.events)]
            return sorted(found, key=lambda m: m.start_ns)
    names = [p.name for p in list(profile.planes)]
    raise TpuUnavailable(f"the trace has no plane {wanted!r} (planes: {names})")


def read(path: str, device: int = 0) -> list[Module]:
    """The programs of the trace file ``path`` (``*.xplane.pb``) on TPU ``device``."""
    from jax.profiler import ProfileData

    return modules(ProfileData.from_file(path), device)


def casebook_sample_marker(x):
    """A program of a few microseconds run before and after each sample of a trace that
    holds several: the programs between a pair are that sample's."""
    return x + 1


MARKER = f"jit_{casebook_sample_marker.__name__}"


def split(ran: list[Module], samples: int) -> list[list[Module]]:
    """The programs of each of ``samples`` samples in one trace's ``ran`` (start order):
    those between the sample's pair of markers. A trace whose markers do not pair up
    ``samples`` times cannot be split and raises TpuUnavailable."""
    marks = [i for i, m in enumerate(ran) if m.name.split("(")[0] == MARKER]
    if len(marks) != 2 * samples:
        raise TpuUnavailable(f"the trace holds {len(marks)} sample markers for {samples} "
                             f"samples (2 each): its programs cannot be told apart")
    return [ran[marks[2 * k] + 1:marks[2 * k + 1]] for k in range(samples)]


def find() -> str:
    """This process's TPU, by JAX's device kind ("TPU v5 lite"); TpuUnavailable if its
    jax runs on none."""
    import jax

    device = jax.devices()[0]
    if device.platform != "tpu":
        raise TpuUnavailable(f"jax runs on {device.platform}, not a TPU")
    return device.device_kind


def _options():
    """Device tracing only: no host or Python tracer in the trace (smaller, cheaper)."""
    import jax

    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 0
    options.python_tracer_level = 0
    return options


class TraceClock:
    """Device time from a profiler trace around each sample: the sum of the programs the
    chip ran in it. Starting and reading the trace costs wall time outside the sample."""

    kind = "tpu_trace"
    description = ("TPU device time from jax's profiler trace: the sum of the programs "
                   "(XLA modules) executed in the sample, host launch and wait reported apart")
    resolution_s = 1e-12  # the trace's device_duration_ps

    samples_per_window = SAMPLES_PER_TRACE

    def __init__(self, device: int = 0):
        self.device = device
        self._marker = None

    def _mark(self) -> None:
        import jax
        import jax.numpy as jnp

        if self._marker is None:
            self._marker = (jax.jit(casebook_sample_marker), jnp.zeros((), jnp.int32))
        marker, token = self._marker
        marker(token).block_until_ready()

    def time(self, launch: clocks.Launch, wait: clocks.Wait) -> tuple[Any, clocks.Timing]:
        (out, host_s), ran = self._traced(launch, wait)
        if not ran:
            raise TpuUnavailable("the trace saw no program on the TPU: nothing ran on it")
        device_s = sum(m.seconds for m in ran)
        return out, clocks.Timing(seconds=device_s, host_s=host_s, kernels=len(ran))

    def time_many(self, samples: list[tuple[Callable[[], Any], clocks.Launch, clocks.Wait]]
                  ) -> list[tuple[Any, clocks.Timing]]:
        """Samples (before, launch, wait) timed in one trace: ``before`` (an input set's
        preparation) untimed, then the launch and wait between two markers; each sample's
        device time the programs between its markers."""
        self._mark()  # compiled before the trace
        hosts: list[tuple[Any, float]] = []

        def block() -> None:
            for before, launch, wait in samples:
                before()
                self._mark()
                start = clocks.now_ns()
                out = launch()
                wait(out)
                hosts.append((out, (clocks.now_ns() - start) * 1e-9))
                self._mark()

        _, ran = self._traced(block, lambda _: None)
        timed = []
        for (out, host_s), programs in zip(hosts, split(ran, len(samples)), strict=True):
            if not programs:
                raise TpuUnavailable("the trace saw no program on the TPU in a sample: "
                                     "nothing ran on it")
            device_s = sum(m.seconds for m in programs)
            timed.append((out, clocks.Timing(seconds=device_s, host_s=host_s,
                                             kernels=len(programs))))
        return timed

    def device_seconds(self, block: clocks.Launch) -> float:
        """The device work of the programs the chip ran while ``block`` ran (the
        early-return guard's reading: what a fetch still finds to run)."""
        _, ran = self._traced(block, lambda _: None)
        return sum(m.seconds for m in ran)

    def _traced(self, launch: clocks.Launch, wait: clocks.Wait
                ) -> tuple[tuple[Any, float], list[Module]]:
        """(output, host seconds of launch and wait) and the chip's programs meanwhile."""
        import jax

        folder = tempfile.mkdtemp(prefix="casebook-trace-")
        try:
            jax.profiler.start_trace(folder, profiler_options=_options())
            try:
                start = clocks.now_ns()
                out = launch()
                wait(out)
                host_s = (clocks.now_ns() - start) * 1e-9
            finally:
                jax.profiler.stop_trace()
            [path] = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
            ran = read(path, self.device)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return (out, host_s), ran

    def close(self) -> None:
        """Nothing held between samples."""
