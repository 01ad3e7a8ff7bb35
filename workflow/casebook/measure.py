"""Measuring, stopping and summarising, kept apart (as NVBench keeps them).

The minimal protocol: discard warm-up calls, then take host-clock samples around a
fully synchronised call until a fixed-count-and-time criterion holds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from scipy import stats

CLOCK = "host perf_counter_ns around a call that waits for completion"


@dataclasses.dataclass(frozen=True)
class Protocol:
    warmup_calls: int = 3
    min_samples: int = 20
    max_samples: int = 200
    min_time_s: float = 0.5
    max_time_s: float = 20.0
    confidence: float = 0.95

    def __post_init__(self):
        if self.warmup_calls < 1:
            raise ValueError(f"{self.warmup_calls=} must be at least 1 (compilation)")
        if not 5 <= self.min_samples <= self.max_samples:
            raise ValueError(f"need 5 <= {self.min_samples=} <= {self.max_samples=}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"{self.confidence=} must lie in (0.5, 1)")


class CountAndTime:
    """Stop once ``min_samples`` and ``min_time_s`` are both reached, or at a bound."""

    def __init__(self, protocol: Protocol):
        self.protocol = protocol
        self.count, self.total, self.reason = 0, 0.0, None

    def add(self, seconds: float, elapsed: float) -> None:
        self.count += 1
        self.total += seconds
        p = self.protocol
        if self.count >= p.min_samples and self.total >= p.min_time_s:
            self.reason = f"{p.min_samples} samples and {p.min_time_s} s of samples reached"
        elif self.count >= p.max_samples:
            self.reason = f"max_samples ({p.max_samples}) reached"
        elif elapsed >= p.max_time_s and self.count >= 5:
            self.reason = f"max_time_s ({p.max_time_s} s) reached"

    @property
    def finished(self) -> bool:
        return self.reason is not None


def sample(call: Callable[[], Any], protocol: Protocol) -> tuple[list[float], str]:
    """Seconds per synchronised ``call()`` after warm-up, and why sampling stopped."""
    for _ in range(protocol.warmup_calls):
        call()
    criterion = CountAndTime(protocol)
    samples: list[float] = []
    start = time.perf_counter()
    while not criterion.finished:
        t0 = time.perf_counter_ns()
        call()
        seconds = (time.perf_counter_ns() - t0) * 1e-9
        samples.append(seconds)
        criterion.add(seconds, time.perf_counter() - start)
    return samples, criterion.reason


def median_interval(samples: Sequence[float], confidence: float) -> tuple[float, float]:
    """Distribution-free interval for the median from binomial order statistics."""
    ordered = sorted(samples)
    n = len(ordered)
    # [X_(j), X_(n-j+1)] covers the median with probability >= confidence, where j is
    # the smallest count with P(Binomial(n, 1/2) <= j) >= (1 - confidence) / 2.
    j = max(int(stats.binom.ppf((1 - confidence) / 2, n, 0.5)), 1)
    return ordered[j - 1], ordered[n - j]


def summarize(samples: Sequence[float], confidence: float) -> dict[str, Any]:
    median = statistics.median(samples)
    lo, hi = median_interval(samples, confidence)
    mad = statistics.median(abs(s - median) for s in samples)
    return {
        "samples": len(samples),
        "median_s": median,
        "ci_low_s": lo,
        "ci_high_s": hi,
        "confidence": confidence,
        "mean_s": statistics.fmean(samples),
        "stdev_s": statistics.stdev(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "relative_noise": 1.4826 * mad / median,  # robust stdev/median (normal-consistent)
        "total_sample_s": math.fsum(samples),
    }


def compare(kernel: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Baseline-over-kernel ratio of medians with a conservative interval and a verdict.

    The interval divides the medians' own intervals end to end; the verdict is FASTER or
    SLOWER only when it excludes 1, SAME when it lies within ±2%, AMBIGUOUS otherwise.
    """
    ratio = baseline["median_s"] / kernel["median_s"]
    low = baseline["ci_low_s"] / kernel["ci_high_s"]
    high = baseline["ci_high_s"] / kernel["ci_low_s"]
    if low > 1:
        verdict = "FASTER"
    elif high < 1:
        verdict = "SLOWER"
    elif low >= 0.98 and high <= 1.02:
        verdict = "SAME"
    else:
        verdict = "AMBIGUOUS"
    return {"speedup": ratio, "speedup_ci_low": low, "speedup_ci_high": high, "verdict": verdict}
