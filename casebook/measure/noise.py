"""The host's noise floors: A/A protocols on one fixed workload, in two designs.

Separate (``a_a``): the same workload is measured as two series, A and A', one
measurement after the other (A then A', then A' then A, ...), each made exactly as a
case's time and baseline records are. The ratio of each round's medians would be 1 on a
perfect host; the ``quantile`` of |ln ratio| over the rounds is the smallest relative
difference two separate measurements resolve, and where a rerun's median lands: every
record's interval is widened to it.

Paired (``a_a_paired``): A and A' (the same computation on separate inputs) are measured
interleaved in one measurement, sample by sample in a shuffled order
(``engine.measure_interleaved``); the floor is the same quantile over as many such
measurements. Drift of the host over seconds slows both alike and cancels in the ratio,
so this floor is the one a comparison measured interleaved is judged against.

Neither floor is finer than one step of the clock relative to the workload's median
(``resolved``): a clock that reads every sample alike says nothing below its step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from casebook.measure import engine, stats

Measure = Callable[[int], engine.Measurement]
MeasurePair = Callable[[int], dict[str, engine.Measurement]]


def floor_from_ratios(ratios: list[float], quantile: float) -> float:
    """exp(d_(k)) - 1, with d_(k) the k-th smallest |ln r|, k = ceil(quantile·(n+1)) (at
    most n): symmetric in which series came first. A further ratio from the same host
    stays within it with probability k/(n+1) ≥ ``quantile`` (distribution-free: ranks of
    exchangeable values), which an interpolated sample quantile (about (n-1)·quantile+1)
    undershoots: 19/21 ≈ 90.5% for 20 rounds at 0.95, where this takes the largest."""
    deviations = np.sort(np.abs(np.log(np.asarray(ratios, float))))
    k = min(math.ceil(quantile * (len(deviations) + 1)), len(deviations))
    return float(math.expm1(deviations[k - 1]))


def resolved(floor: float, resolution_s: float, median_s: float) -> dict[str, Any]:
    """The floor, never finer than one step of the clock relative to the median: on the
    H200 every sample of the 3.17 µs A/A workload read one value of the 32 ns timer, every
    ratio was 1 and the rounds' floor 0, which no comparison can honestly be judged by."""
    step = resolution_s / median_s
    return {"noise_floor": max(floor, step), "clock_resolution_s": resolution_s,
            "floor_set_by": "ratios" if floor >= step else "clock resolution"}


def a_a(measure: Measure, rounds: int, quantile: float) -> dict[str, Any]:
    """Run ``rounds`` interleaved A/A rounds; ``measure(seed)`` makes one measurement."""
    _check(rounds, quantile)
    ratios, medians, first = [], [], None
    for r in range(rounds):
        a, b = measure(2 * r), measure(2 * r + 1)
        first = first or a
        median_a, median_b = float(np.median(a.kept)), float(np.median(b.kept))
        # Odd rounds measure A' first: the ratio is always A over A'.
        ratios.append(median_a / median_b if r % 2 == 0 else median_b / median_a)
        medians += [median_a, median_b]
    median = float(np.median(medians))
    return {"rounds": rounds, "quantile": quantile, "ratios": ratios, "median_s": median,
            **resolved(floor_from_ratios(ratios, quantile), first.clock_resolution_s, median),
            "clock": first.clock, "clock_kind": first.clock_kind,
            "cache": {"mode": first.cache_mode, "description": first.cache_description}}


def _check(rounds: int, quantile: float) -> None:
    if rounds < 4:
        raise ValueError(f"{rounds=} must be at least 4 for a quantile to mean anything")
    if not 0.5 <= quantile < 1:
        raise ValueError(f"{quantile=} must lie in [0.5, 1)")


def a_a_paired(measure_pair: MeasurePair, rounds: int, quantile: float) -> dict[str, Any]:
    """Run ``rounds`` interleaved A/A measurements; ``measure_pair(seed)`` makes one and
    returns {"A": ..., "A'": ...}. Each ratio is the median of the per-round ratios
    (``stats.paired_ratio``) over the rounds both kept a sample in."""
    _check(rounds, quantile)
    ratios, medians, paired_rounds = [], [], []
    for r in range(rounds):
        pair = measure_pair(r)
        a, b = stats.paired_rounds(pair["A"].kept_by_round, pair["A'"].kept_by_round)
        ratios.append(stats.paired_ratio(a, b, 0.95)[0])
        medians += [float(np.median(a)), float(np.median(b))]
        paired_rounds.append(len(a))
    median = float(np.median(medians))
    return {"rounds": rounds, "quantile": quantile, "ratios": ratios, "median_s": median,
            "samples_per_series": int(np.median(paired_rounds)),
            **resolved(floor_from_ratios(ratios, quantile), pair["A"].clock_resolution_s,
                       median)}


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
