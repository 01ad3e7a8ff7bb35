"""Bounds for tests that draw fresh random inputs: each such test fails on a correct
implementation with probability at most MISS (docs/testing.md lists them)."""

from __future__ import annotations

from scipy import stats

MISS = 1e-6


def fewest_hits(trials: int, coverage: float) -> int:
    """The fewest hits ``trials`` independent draws of an interval with ``coverage`` give,
    except with probability at most MISS (the binomial's MISS quantile)."""
    return int(stats.binom.ppf(MISS, trials, coverage))  # P(hits < it) < MISS
