"""Stopping criteria: separate units that see only sample times and say when to stop.

A criterion is fed ``add(seconds, elapsed_s)`` after each kept sample (``elapsed_s`` is
the wall time since sampling began, discarded samples included) and answers
``finished``; once finished, ``reason`` says why in words a reader can check. None of
them measures or prints anything (NVBench keeps the same three-way split).
"""

from __future__ import annotations

import abc
import dataclasses
import math
import statistics
from typing import Protocol

from casebook.measure import stats


class Criterion(Protocol):
    name: str
    reason: str | None

    def add(self, seconds: float, elapsed_s: float) -> None: ...

    @property
    def finished(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What every adaptive criterion needs before and regardless of its target."""

    min_samples: int
    min_time_s: float
    timeout_s: float

    def __post_init__(self):
        if self.min_samples < 5:
            raise ValueError(f"{self.min_samples=} must be at least 5 (an interval needs them)")
        if self.min_time_s < 0 or self.timeout_s <= 0:
            raise ValueError(f"{self.min_time_s=} must be >= 0 and {self.timeout_s=} > 0")


class _Base:
    name = "base"

    def __init__(self):
        self.samples: list[float] = []
        self.reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.reason is not None


class FixedCount(_Base):
    """Exactly ``count`` kept samples."""

    name = "fixed_count"

    def __init__(self, count: int):
        super().__init__()
        if count < 5:
            raise ValueError(f"{count=} must be at least 5")
        self.count = count

    def add(self, seconds: float, elapsed_s: float) -> None:
        self.samples.append(seconds)
        if len(self.samples) >= self.count:
            self.reason = f"fixed count: {self.count} samples taken"


class TimeBudget(_Base):
    """Samples until ``budget_s`` of wall time has passed (do_bench's 100 ms of repeats)."""

    name = "time_budget"

    def __init__(self, budget_s: float, min_samples: int = 5):
        super().__init__()
        if budget_s <= 0 or min_samples < 5:
            raise ValueError(f"{budget_s=} must be > 0 and {min_samples=} >= 5")
        self.budget_s, self.min_samples = budget_s, min_samples

    def add(self, seconds: float, elapsed_s: float) -> None:
        self.samples.append(seconds)
        if elapsed_s >= self.budget_s and len(self.samples) >= self.min_samples:
            self.reason = (f"time budget: {self.budget_s:g} s spent, "
                           f"{len(self.samples)} samples")


class _Adaptive(_Base, abc.ABC):
    """Shared guard rails: minimum count and sampling time (wall) before a target can
    stop, a timeout."""

    def __init__(self, bounds: Bounds):
        super().__init__()
        self.bounds = bounds

    def add(self, seconds: float, elapsed_s: float) -> None:
        # min_time_s is wall time since sampling began, not the samples' sum: on an H200 a
        # 3 µs kernel sampled once a millisecond would need 6,000 samples (6 s) to sum to
        # 20 ms, and every GPU measurement ran to its timeout.
        self.samples.append(seconds)
        b = self.bounds
        if len(self.samples) >= b.min_samples and elapsed_s >= b.min_time_s:
            self.reason = self.check()
        if self.reason is None and elapsed_s >= b.timeout_s and len(self.samples) >= 5:
            self.reason = (f"timeout: {b.timeout_s:g} s passed with {len(self.samples)} "
                           f"samples, {self.progress()}")

    @abc.abstractmethod
    def check(self) -> str | None:
        """Why to stop now that the bounds are met, or None to go on."""

    @abc.abstractmethod
    def progress(self) -> str:
        """Where the target stands, for the timeout's reason."""


class RelativeNoise(_Adaptive):
    """NVBench's stdrel: stdev/mean ≤ ``target``, or stop when the noise has plateaued.

    Plateau: once ``plateau_window`` noise estimates exist, the recent ones vary by less
    than ``plateau_tolerance`` relative to their mean, so more samples will not lower it.
    """

    name = "relative_noise"

    def __init__(self, target: float, bounds: Bounds, plateau_window: int = 64,
                 plateau_tolerance: float = 0.05):
        super().__init__(bounds)
        if not 0 < target < 1:
            raise ValueError(f"{target=} must lie in (0, 1)")
        if plateau_window < 8:
            raise ValueError(f"{plateau_window=} must be at least 8")
        self.target, self.window, self.tolerance = target, plateau_window, plateau_tolerance
        self.noise: list[float] = []

    def _noise(self) -> float:
        return statistics.stdev(self.samples) / statistics.fmean(self.samples)

    def check(self) -> str | None:
        noise = self._noise()
        self.noise.append(noise)
        if noise <= self.target:
            return (f"relative noise: stdev/mean {noise:.2%} ≤ target {self.target:.2%} "
                    f"after {len(self.samples)} samples")
        # NVBench checks every 16 samples once 64 estimates exist; a window of recent
        # estimates that no longer moves means the target is out of reach.
        recent = self.noise[-self.window:]
        if len(self.noise) >= self.window and len(self.noise) % 16 == 0:
            spread = statistics.stdev(recent) / statistics.fmean(recent)
            if spread < self.tolerance:
                return (f"relative noise plateaued at {noise:.2%} (target {self.target:.2%} "
                        f"unreachable on this host) after {len(self.samples)} samples")
        return None

    def progress(self) -> str:
        return f"stdev/mean {self._noise():.2%} (target {self.target:.2%})"


class MedianPrecision(_Adaptive):
    """Stop once the median's distribution-free interval is within ±``target`` of it.

    This asks directly for what a comparison needs (a tight median), not for low
    spread: heavy-tailed or bimodal samples still converge, as order statistics do not
    care about outliers. The target is checked after every sample (cheap: a sort).
    """

    name = "median_precision"

    def __init__(self, target: float, confidence: float, bounds: Bounds):
        super().__init__(bounds)
        if not 0 < target < 1:
            raise ValueError(f"{target=} must lie in (0, 1)")
        self.target, self.confidence = target, confidence

    def _precision(self) -> float:
        return stats.relative_half_width(self.samples, self.confidence)

    def check(self) -> str | None:
        precision = self._precision()
        if precision <= self.target:
            return (f"median precision: {self.confidence:.0%} interval ±{precision:.2%} ≤ "
                    f"±{self.target:.2%} after {len(self.samples)} samples")
        return None

    def progress(self) -> str:
        precision = self._precision()
        return (f"median interval ±{precision:.2%} (target ±{self.target:.2%})"
                if math.isfinite(precision) else "no interval yet")
