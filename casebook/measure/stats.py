"""Numbers from samples: the median's interval, summaries, the ratio of medians, verdicts.

Numpy/scipy only: no clock, no device. Everything here is testable on synthetic data.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

# The four verdicts a comparison can reach; only FASTER and SLOWER print a ratio.
FASTER, SLOWER, SAME, AMBIGUOUS = "FASTER", "SLOWER", "SAME", "AMBIGUOUS"
# Bootstrap resamples: the percentile interval's end points move by well under 0.1% of
# the ratio between two runs at this count for samples of 20-500 values.
BOOTSTRAP_RESAMPLES = 4000


@functools.lru_cache(maxsize=4096)
def _order_rank(n: int, confidence: float) -> int:
    """The largest j with P(Binomial(n, 1/2) < j) <= (1 - confidence) / 2 (at least 1).
    Cached: a stopping criterion asks after every sample, and the quantile function
    costs several times the rest of its check."""
    return max(int(stats.binom.ppf((1 - confidence) / 2, n, 0.5)), 1)


def _interval_of_sorted(ordered: Sequence[float], confidence: float) -> tuple[float, float]:
    n = len(ordered)
    # [X_(j), X_(n-j+1)] covers the median with probability >= confidence.
    j = _order_rank(n, confidence)
    return ordered[j - 1], ordered[n - j]


def median_interval(samples: Sequence[float], confidence: float) -> tuple[float, float]:
    """Distribution-free interval for the median from binomial order statistics."""
    return _interval_of_sorted(sorted(samples), confidence)


def relative_half_width(samples: Sequence[float], confidence: float) -> float:
    """Half the median interval's width over the median: the precision reached."""
    ordered = sorted(samples)
    lo, hi = _interval_of_sorted(ordered, confidence)
    return (hi - lo) / 2 / statistics.median(ordered)


def robust_noise(samples: Sequence[float]) -> float:
    """1.4826·MAD/median: a stdev/mean that one outlier cannot move (normal-consistent)."""
    median = statistics.median(samples)
    return 1.4826 * statistics.median(abs(s - median) for s in samples) / median


def rerun_interval(repeat_medians: Sequence[float], center: float, confidence: float
                   ) -> tuple[float, float]:
    """Where the median of a rerun with as many repeats lands, with ``confidence``.

    A Student-t prediction interval on ln(median) around ``center`` (the median of every
    sample, which is nearer a median of the repeats' levels than their mean: its variance
    is up to π/2 times the mean's, so the interval takes that factor): the spread of the
    repeats' medians estimates the run-to-run variance that samples of one run cannot
    show (a host's clock and load drift over seconds, not between samples).
    """
    logs = np.log(np.asarray(repeat_medians, float))
    r = len(logs)
    if r < 2:
        raise ValueError(f"a rerun interval needs at least 2 repeats, got {r}")
    spread = np.std(logs, ddof=1) * math.sqrt(2 * (math.pi / 2) / r)  # of two runs' medians
    half = stats.t.ppf((1 + confidence) / 2, r - 1) * spread
    return center * math.exp(-half), center * math.exp(half)


def floor_interval(center: float, floor: float) -> tuple[float, float]:
    """Where a rerun's median lands on this host: ``center``·[1/(1+floor), 1+floor].

    The host's noise floor is a quantile of |ln A/A'| over pairs of separate
    measurements, so a rerun lands this close with that quantile's probability, whatever
    drift between runs the repeats of one run could not see.
    """
    if not floor >= 0:
        raise ValueError(f"a noise floor must be a number >= 0, got {floor!r}")
    return center / (1 + floor), center * (1 + floor)


def summarize(samples: Sequence[float], confidence: float,
              repeat_medians: Sequence[float] = (), floor: float | None = None
              ) -> dict[str, Any]:
    """Summary of the kept samples. The median's interval is the widest of the samples'
    order-statistic interval, the repeats' rerun interval (two or more repeats) and the
    host's floor interval (where a noise floor is recorded)."""
    median = statistics.median(samples)
    lo, hi = median_interval(samples, confidence)
    spread: dict[str, Any] = {"interval": "within-run", "repeats": 1, "floor_applied": floor}
    if len(repeat_medians) >= 2:
        rerun_lo, rerun_hi = rerun_interval(repeat_medians, median, confidence)
        lo, hi = min(lo, rerun_lo), max(hi, rerun_hi)
        spread.update(repeats=len(repeat_medians),
                      repeat_medians_s=[float(m) for m in repeat_medians])
    if floor is not None:
        floor_lo, floor_hi = floor_interval(median, floor)
        lo, hi = min(lo, floor_lo), max(hi, floor_hi)
    if len(repeat_medians) >= 2 or floor is not None:
        spread["interval"] = "run-to-run"
    return {
        "samples": len(samples),
        "median_s": median,
        "ci_low_s": lo,
        "ci_high_s": hi,
        "confidence": confidence,
        **spread,
        "mean_s": statistics.fmean(samples),
        "stdev_s": statistics.stdev(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "relative_noise": robust_noise(samples),
        "total_sample_s": math.fsum(samples),
    }


def _seed_of(*series: Sequence[float]) -> int:
    """A seed drawn from the data: re-rendering the same samples gives the same interval."""
    digest = hashlib.sha256(np.concatenate([np.asarray(s, float) for s in series]).tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


def ratio_of_medians(numerator: Sequence[float], denominator: Sequence[float],
                     confidence: float, rng: np.random.Generator | None = None
                     ) -> tuple[float, float, float]:
    """median(numerator)/median(denominator) with a percentile bootstrap interval.

    The two series are resampled independently (they are separate measurements).
    Without ``rng`` the bootstrap is seeded from the data, so a page renders the same
    interval every time it is rebuilt from the same samples.
    """
    a, b = np.asarray(numerator, float), np.asarray(denominator, float)
    rng = rng if rng is not None else np.random.default_rng(_seed_of(a, b))
    result = stats.bootstrap(
        (a, b), lambda x, y, axis: np.median(x, axis=axis) / np.median(y, axis=axis),
        vectorized=True, paired=False, confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES, method="percentile", random_state=rng)
    ci = result.confidence_interval
    return float(np.median(a) / np.median(b)), float(ci.low), float(ci.high)


def paired_rounds(numerator: dict[int, float], denominator: dict[int, float]
                  ) -> tuple[list[float], list[float]]:
    """The two series' samples of the rounds both kept (round -> seconds), in round
    order: an interleaved measurement's pairs."""
    shared = sorted(set(numerator) & set(denominator))
    return [numerator[r] for r in shared], [denominator[r] for r in shared]


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float],
                 confidence: float) -> tuple[float, float, float]:
    """The median of the per-round ratios numerator[i]/denominator[i] of samples taken in
    the same round i of an interleaved measurement, with its distribution-free
    order-statistic interval: what drifts between rounds slows both samples of a round
    alike and cancels in its ratio (a ratio of the two medians would not cancel it: they
    may come from different rounds)."""
    a, b = np.asarray(numerator, float), np.asarray(denominator, float)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 5:
        raise ValueError(f"paired series need equal lengths of at least 5, got "
                         f"{a.shape} and {b.shape}")
    ratios = a / b
    low, high = median_interval(ratios, confidence)
    return float(np.median(ratios)), float(low), float(high)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How many times faster the candidate is than the reference, and what that means."""

    speedup: float  # median(reference) / median(candidate)
    low: float
    high: float
    floor: float | None  # the host's minimum detectable relative effect, if recorded
    verdict: str
    # "separate": two measurements made apart (their floor: noise_floor); "paired": both
    # interleaved round by round in one measurement (their floor: paired_floor).
    design: str = "separate"

    @property
    def printable(self) -> bool:
        """A speedup is shown only when its whole interval lies outside a recorded floor."""
        return self.floor is not None and self.verdict in (FASTER, SLOWER)

    def as_dict(self) -> dict[str, Any]:
        return {"speedup": self.speedup, "speedup_ci_low": self.low,
                "speedup_ci_high": self.high, "noise_floor": self.floor,
                "verdict": self.verdict, "printable": self.printable,
                "design": self.design}


def verdict(low: float, high: float, floor: float) -> str:
    """FASTER/SLOWER when the interval clears the floor band, SAME inside it, else AMBIGUOUS.

    The band is [1/(1+floor), 1+floor]: ratios this host cannot tell from 1.
    """
    band_low, band_high = 1 / (1 + floor), 1 + floor
    if low > band_high:
        return FASTER
    if high < band_low:
        return SLOWER
    if band_low <= low and high <= band_high:
        return SAME
    return AMBIGUOUS


def compare(candidate: Sequence[float], reference: Sequence[float], confidence: float,
            floor: float | None, rng: np.random.Generator | None = None) -> Comparison:
    """Speedup of ``candidate`` over ``reference`` (times in seconds) with its verdict.

    Without a recorded floor the band has zero width: the verdict still says whether the
    interval excludes 1, but it is never SAME (nothing says what "same" means here).
    """
    speedup, low, high = ratio_of_medians(reference, candidate, confidence, rng)
    return Comparison(speedup, low, high, floor, verdict(low, high, floor or 0.0))


def compare_paired(candidate: Sequence[float], reference: Sequence[float], confidence: float,
                   floor: float | None) -> Comparison:
    """``compare`` for samples taken in the same rounds of an interleaved measurement
    (``paired_ratio``); ``floor``: the host's paired A/A floor."""
    speedup, low, high = paired_ratio(reference, candidate, confidence)
    return Comparison(speedup, low, high, floor, verdict(low, high, floor or 0.0), "paired")


def share_interval(count: int, trials: int, confidence: float) -> tuple[float, float]:
    """The Clopper–Pearson interval of a share observed as ``count`` of ``trials``: exact
    for a binomial count (never narrower than the truth allows), so a rate seen as 0 of
    1,000 still states how high it may be."""
    if not 0 <= count <= trials or trials < 1:
        raise ValueError(f"{count} of {trials} is not a share")
    alpha = 1 - confidence
    low = stats.beta.ppf(alpha / 2, count, trials - count + 1) if count else 0.0
    high = stats.beta.ppf(1 - alpha / 2, count + 1, trials - count) if count < trials else 1.0
    return float(low), float(high)
