"""A CPU measurement runs with its process on one CPU, pinned before jax starts.

On a small virtual machine a process whose threads move between vCPUs takes hypervisor
steal and cache migrations, and its A/A ratios spread several times wider than pinned
(benchmarks/results/rerun_coverage.json records both). XLA sizes its CPU thread pool
from the affinity it finds when its backend starts (not on import), so pinning must come
first: pinning an already started XLA squeezes its threads onto one CPU, where they take
turns (slower, and noisier than not pinning).
"""

from __future__ import annotations

import os
import sys


def chosen_cpu(allowed: set[int]) -> int:
    """The highest-numbered allowed CPU: CPU 0 takes most interrupts on Linux."""
    if not allowed:
        raise ValueError("no CPU is allowed to this process")
    return max(allowed)


def pin_process() -> int | None:
    """Pins this process to one of its CPUs and returns it; None where affinity is not
    Linux's (nothing pinned, and records say so). Raises if an XLA backend has started
    (importing jax starts none: a job forked from the run's worker pins itself)."""
    if "jax" in sys.modules:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            raise RuntimeError("pin the process before jax starts a backend: XLA has "
                               "already sized its thread pool for every CPU")
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = chosen_cpu(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def pinned_cpu() -> int | None:
    """The one CPU this thread may run on, or None when it may run on several."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    return next(iter(allowed)) if len(allowed) == 1 else None


def pin_for(target: str, measurement: dict, stand_in: bool = False) -> int | None:
    """A measuring job's pinning: on target cpu when ``measurement.pin_cpu`` (default
    true). Never on a GPU target, whose host threads feed the device, nor for a host
    stand-in for a kernel (``stand_ins.is_stand_in``): its host time is no speed result, it
    runs on one core beside other jobs, and the interpreter runs a thread per warpgroup
    that one CPU would serialise (a splash forward time job took about twice as long
    pinned)."""
    return pin_process() if pins(target, measurement, stand_in) else None


def pins(target: str, measurement: dict, stand_in: bool = False) -> bool:
    """Whether ``pin_for`` pins such a job (one that must then import jax itself)."""
    return (target == "cpu" and not stand_in and measurement.get("pin_cpu", True)
            and hasattr(os, "sched_setaffinity"))
