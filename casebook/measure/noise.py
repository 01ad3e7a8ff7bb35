"""The host's noise floor: an A/A protocol on one fixed workload.

The same workload is measured as two series, A and A', interleaved round by round
(A then A', then A' then A, ...), each measurement made exactly as a case's are. The
ratio of each round's medians would be 1 on a perfect host; the ``quantile`` of
|ln ratio| over the rounds is the smallest relative difference this host resolves —
the minimum detectable effect printed beside every comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from casebook.measure import engine

Measure = Callable[[int], engine.Measurement]


def floor_from_ratios(ratios: list[float], quantile: float) -> float:
    """exp(quantile of |ln r|) - 1: symmetric in which series came first."""
    deviations = np.abs(np.log(np.asarray(ratios, float)))
    return float(math.expm1(np.quantile(deviations, quantile)))


def a_a(measure: Measure, rounds: int, quantile: float) -> dict[str, Any]:
    """Run ``rounds`` interleaved A/A rounds; ``measure(seed)`` makes one measurement."""
    if rounds < 4:
        raise ValueError(f"{rounds=} must be at least 4 for a quantile to mean anything")
    if not 0.5 <= quantile < 1:
        raise ValueError(f"{quantile=} must lie in [0.5, 1)")
    ratios, medians, first = [], [], None
    for r in range(rounds):
        a, b = measure(2 * r), measure(2 * r + 1)
        first = first or a
        median_a, median_b = float(np.median(a.kept)), float(np.median(b.kept))
        # Odd rounds measure A' first: the ratio is always A over A'.
        ratios.append(median_a / median_b if r % 2 == 0 else median_b / median_a)
        medians += [median_a, median_b]
    return {"rounds": rounds, "quantile": quantile, "ratios": ratios,
            "median_s": float(np.median(medians)),
            "noise_floor": floor_from_ratios(ratios, quantile),
            "clock": first.clock, "clock_kind": first.clock_kind,
            "cache": {"mode": first.cache_mode, "description": first.cache_description}}


def matmul_workload(size: int) -> engine.Workload:
    """The host's reference workload: one jitted float32 matmul of two size×size inputs."""
    import jax.numpy as jnp

    from kernels import contract
    from kernels.runnable import from_jax

    runnable = from_jax(jnp.matmul, ("a", "b"), contract.execution("XLA"))

    def make_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {name: rng.standard_normal((size, size), dtype=np.float32)
                for name in ("a", "b")}

    return engine.Workload(runnable, make_inputs)
