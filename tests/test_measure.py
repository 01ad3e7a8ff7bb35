"""The minimal timing protocol: stopping, the median's interval, the verdict."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from casebook import measure


def test_protocol_rejects_bad_values():
    with pytest.raises(ValueError, match="warmup_calls"):
        measure.Protocol(warmup_calls=0)
    with pytest.raises(ValueError, match="min_samples"):
        measure.Protocol(min_samples=50, max_samples=10)


def test_stops_on_count_and_time_or_at_a_bound():
    protocol = measure.Protocol(min_samples=5, max_samples=8, min_time_s=1.0, max_time_s=100)
    criterion = measure.CountAndTime(protocol)
    for _ in range(5):
        criterion.add(0.1, elapsed=0.0)
    assert not criterion.finished  # 5 samples but only 0.5 s
    for _ in range(3):
        criterion.add(0.1, elapsed=0.0)
    assert criterion.reason == "max_samples (8) reached"
    criterion = measure.CountAndTime(protocol)
    for _ in range(5):
        criterion.add(0.3, elapsed=0.0)
    assert "samples and" in criterion.reason


def test_sample_discards_warmup_and_counts_calls():
    calls = []
    samples, reason = measure.sample(lambda: calls.append(1), measure.Protocol(
        warmup_calls=4, min_samples=6, max_samples=6, min_time_s=10, max_time_s=60))
    assert len(samples) == 6 and len(calls) == 10
    assert "max_samples" in reason


def test_median_interval_covers_the_true_median(rng):
    """Over fresh draws from a known distribution, coverage is at least the confidence."""
    true_median = np.log(2)  # exponential(1)
    hits = 0
    for _ in range(400):
        lo, hi = measure.median_interval(rng.exponential(size=30), 0.95)
        hits += lo <= true_median <= hi
    assert hits / 400 >= 0.92  # 0.95 nominal, minus sampling error of 400 trials


def test_summary_of_known_samples():
    summary = measure.summarize([1.0, 2.0, 3.0, 4.0, 100.0], 0.9)
    assert summary["median_s"] == 3.0
    assert summary["ci_low_s"] <= 3.0 <= summary["ci_high_s"]
    assert summary["relative_noise"] == pytest.approx(1.4826 * 1.0 / 3.0)
    assert summary["mean_s"] == statistics.fmean([1, 2, 3, 4, 100])


def m(median, lo, hi):
    return {"median_s": median, "ci_low_s": lo, "ci_high_s": hi}


@pytest.mark.parametrize(("kernel", "baseline", "verdict"), [
    (m(1.0, 0.99, 1.01), m(2.0, 1.98, 2.02), "FASTER"),
    (m(2.0, 1.98, 2.02), m(1.0, 0.99, 1.01), "SLOWER"),
    (m(1.0, 0.995, 1.005), m(1.0, 0.995, 1.005), "SAME"),
    (m(1.0, 0.8, 1.2), m(1.05, 0.9, 1.3), "AMBIGUOUS"),
])
def test_compare_verdicts(kernel, baseline, verdict):
    assert measure.compare(kernel, baseline)["verdict"] == verdict
