"""The speed-of-light bound of a measured time: no kernel computes a problem faster than
its minimum work allows on a GPU's peaks.

A case's plug-in states a point's minimum work (``work(params, outputs)``: the FLOPs of
the outputs' math, the bytes that must cross memory at least once, and the lowest
precision whose tensor cores could compute it exactly); ``configs/peaks.yaml`` gives each
target GPU's dense tensor throughput per precision and memory bandwidth, each with its
source, raised to the host's own measured matmul and copy rates where those are higher
(``with_measured``; ``measure.peaks``, kept with the noise floor). The bound is
max(FLOPs / tensor peak, bytes / bandwidth). A measured median below it is impossible,
and the measurement is refused as a guard refuses one (``refusal``).
"""

from __future__ import annotations

import functools
from typing import Any

from casebook.core import config, paths
from casebook.core.errors import CasebookError

PEAKS = paths.PEAKS
PRECISIONS = ("fp4", "fp8", "bf16")  # fastest first: a bound falls back along this order


@functools.cache
def peaks() -> dict[str, Any]:
    """``configs/peaks.yaml``, each GPU's entry checked."""
    found = config.read_yaml(PEAKS)
    if not isinstance(found, dict) or not found:
        raise CasebookError(PEAKS, None, "no GPU's peaks")
    for gpu, entry in found.items():
        for key in ("name", "tensor_flops", "memory_bytes_per_s", "source"):
            if not isinstance(entry, dict) or key not in entry:
                raise CasebookError(PEAKS, f"{gpu}.{key}", "missing")
        flops = entry["tensor_flops"]
        if set(flops) != set(PRECISIONS) or not any(flops.values()):
            raise CasebookError(PEAKS, f"{gpu}.tensor_flops",
                                f"needs {', '.join(PRECISIONS)} (null where absent)")
        rates = [v for v in flops.values() if v is not None] + [entry["memory_bytes_per_s"]]
        if not all(isinstance(v, (int, float)) and v > 0 for v in rates):
            raise CasebookError(PEAKS, gpu, "every peak must be a positive number")
    return found


def peaks_text() -> str:
    """Every GPU's peaks and their source, one line each (the methods page states them)."""
    return "Peaks (configs/peaks.yaml):\n" + "\n".join(
        f"{gpu}: {e['name']}: dense " + ", ".join(
            f"{p} {v:.3g} FLOP/s" for p, v in e["tensor_flops"].items() if v)
        + f"; memory {e['memory_bytes_per_s']:.3g} B/s. Source: " + " ".join(e["source"].split())
        for gpu, e in peaks().items())


def bound(work: dict[str, Any], gpu: str, entry: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """The bound of ``work`` ({flops, bytes, math, basis}) on ``gpu``, with its parts;
    ``entry``: that device's peaks, as a peaks.yaml entry (None: peaks.yaml's)."""
    entry = entry or peaks().get(gpu)
    if entry is None:
        raise CasebookError(PEAKS, gpu, f"no peaks for {gpu!r} (known: {sorted(peaks())})")
    if work["math"] not in PRECISIONS:
        raise ValueError(f"math {work['math']!r} is not one of {PRECISIONS}")
    usable = PRECISIONS[PRECISIONS.index(work["math"]):]
    math = next(p for p in usable if entry["tensor_flops"][p])
    compute_s = work["flops"] / entry["tensor_flops"][math]
    memory_s = work["bytes"] / entry["memory_bytes_per_s"]
    return {"gpu": gpu, "gpu_name": entry["name"], "bound_s": max(compute_s, memory_s),
            "limited_by": "compute" if compute_s >= memory_s else "memory",
            "compute_s": compute_s, "memory_s": memory_s, "flops": int(work["flops"]),
            "bytes": int(work["bytes"]), "math": math,
            "peak_flops": entry["tensor_flops"][math],
            "memory_bytes_per_s": entry["memory_bytes_per_s"], "basis": work["basis"],
            "source": entry["source"]}


def with_measured(entry: dict[str, Any], measured: dict[str, Any] | None) -> dict[str, Any]:
    """A GPU's peaks ``entry`` where this host's own measured ones (``measure.peaks``, in
    its noise-floor record; None: not measured) are higher: a bound never refuses what the
    host was measured doing. The entry says which it used."""
    if not measured:
        return entry
    flops = dict(entry["tensor_flops"])
    math = measured["matmul_math"]
    raised = []
    if math in flops and flops[math] is not None and measured["matmul_flops"] > flops[math]:
        flops[math] = measured["matmul_flops"]
        raised.append(f"{math} tensor rate")
    memory = entry["memory_bytes_per_s"]
    if measured["copy_bytes_per_s"] > memory:
        memory = measured["copy_bytes_per_s"]
        raised.append("memory bandwidth")
    return {**entry, "tensor_flops": flops, "memory_bytes_per_s": memory,
            "source": entry["source"] + (f" Raised to this host's measured {' and '.join(raised)}."
                                         if raised else "")}


def for_target(plugin: Any, params: dict[str, Any], outputs: tuple[str, ...],
               target: str, measured: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The bound of a runnable computing ``outputs`` at ``params`` on GPU ``target``, at
    the higher of its datasheet's peaks and this host's ``measured`` ones; None on a CPU
    target or for a case whose plug-in states no ``work``."""
    hook = getattr(plugin, "work", None)
    if target == "cpu" or hook is None:
        return None
    entry = peaks().get(target)  # None: bound() names the missing entry
    return bound(hook(params, tuple(outputs)), target,
                 entry and with_measured(entry, measured))


def refusal(median_s: float, found: dict[str, Any]) -> str | None:
    """Why a median is impossible against the bound ``found`` (None: it is not)."""
    if median_s >= found["bound_s"]:
        return None
    return (f"impossible: median {median_s:.3e} s is below the speed-of-light bound "
            f"{found['bound_s']:.3e} s on {found['gpu_name']} ({found['flops']:,} FLOP at "
            f"{found['peak_flops']:.3g} {found['math']} FLOP/s, {found['bytes']:,} B at "
            f"{found['memory_bytes_per_s']:.3g} B/s): the timer was fooled")


def fraction(median_s: float, found: dict[str, Any]) -> float:
    """The fraction of the speed of light a median achieves (bound / median)."""
    return found["bound_s"] / median_s
