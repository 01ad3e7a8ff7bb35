"""The numpy-only parts of the engine: intervals, ratios, verdicts, stopping, the floor."""

from __future__ import annotations

import bounds
import numpy as np
import pytest

from casebook.measure import noise, stats, stopping


def test_median_interval_covers_the_true_median(rng):
    """Over fresh draws from a known distribution, coverage is at least the confidence."""
    true_median = np.log(2)  # exponential(1)
    hits = sum(lo <= true_median <= hi for lo, hi in (
        stats.median_interval(rng.exponential(size=30), 0.95) for _ in range(400)))
    assert hits >= bounds.fewest_hits(400, 0.95)  # the interval is exact (≥ 95%)


def test_summary_of_known_samples():
    summary = stats.summarize([1.0, 2.0, 3.0, 4.0, 100.0], 0.9)
    assert summary["median_s"] == 3.0
    assert summary["ci_low_s"] <= 3.0 <= summary["ci_high_s"]
    assert summary["relative_noise"] == pytest.approx(1.4826 * 1.0 / 3.0)


@pytest.mark.seed(20261205)  # a bootstrap's coverage is only near its nominal 95%
def test_bootstrap_ratio_covers_a_known_ratio(rng):
    """Times 1.1× longer than the reference: the interval of the speedup holds 1/1.1."""
    hits = 0
    for _ in range(200):
        ref = rng.lognormal(0, 0.05, 40)
        cand = 1.1 * rng.lognormal(0, 0.05, 40)
        _, lo, hi = stats.ratio_of_medians(ref, cand, 0.95, rng)
        hits += lo <= 1 / 1.1 <= hi
    # 95% nominal (about 96% measured over 400 trials); 180/200 is 3 standard deviations
    # of 200 trials below 95%, while an interval covering 85% of the time fails.
    assert hits >= 180


def test_bootstrap_is_reproducible_from_the_same_samples(rng):
    a, b = rng.lognormal(0, 0.1, 30), rng.lognormal(0, 0.1, 30)
    assert stats.ratio_of_medians(a, b, 0.95) == stats.ratio_of_medians(a, b, 0.95)


@pytest.mark.parametrize(("low", "high", "verdict"), [
    (1.05, 1.10, stats.FASTER),
    (0.90, 0.95, stats.SLOWER),
    (0.99, 1.01, stats.SAME),
    (1.01, 1.06, stats.AMBIGUOUS),  # reaches inside the ±2% floor
    (0.80, 1.30, stats.AMBIGUOUS),
])
def test_verdicts_against_a_two_percent_floor(low, high, verdict):
    assert stats.verdict(low, high, 0.02) == verdict


@pytest.mark.seed(20261205)  # the bootstrap's interval of a 3% speedup, near a 5% floor
def test_a_speedup_inside_the_floor_is_never_printable(rng):
    ref = rng.lognormal(0, 0.01, 50)
    c = stats.compare(ref * 0.97, ref, 0.95, floor=0.05, rng=rng)  # 3% faster, 5% floor
    assert c.verdict in (stats.SAME, stats.AMBIGUOUS) and not c.printable
    c = stats.compare(ref * 0.5, ref, 0.95, floor=0.05, rng=rng)
    assert c.verdict == stats.FASTER and c.printable and c.low > 1.05
    assert not stats.compare(ref * 0.5, ref, 0.95, floor=None, rng=rng).printable


def feed(criterion, values, step_s=0.001):
    for i, v in enumerate(values):
        criterion.add(v, elapsed_s=i * step_s)
        if criterion.finished:
            return i + 1
    return None


def test_fixed_count_and_time_budget():
    assert feed(stopping.FixedCount(7), [1.0] * 20) == 7
    budget = stopping.TimeBudget(0.01)
    assert feed(budget, [1.0] * 100) == 11  # elapsed 0.010 at the 11th sample
    assert "time budget" in budget.reason
    with pytest.raises(ValueError, match="count"):
        stopping.FixedCount(2)


def test_relative_noise_stops_on_target_not_before_its_bounds(rng):
    bounds = stopping.Bounds(min_samples=20, min_time_s=0.0, timeout_s=100)
    criterion = stopping.RelativeNoise(0.01, bounds)
    n = feed(criterion, 1 + 0.001 * rng.standard_normal(500))
    assert n == 20 and "≤ target" in criterion.reason


@pytest.mark.seed(20261205)  # when a random walk of noise looks flat is itself random
def test_relative_noise_detects_a_plateau_above_an_unreachable_target(rng):
    criterion = stopping.RelativeNoise(0.001, stopping.Bounds(10, 0.0, 1e9),
                                       plateau_window=64)
    n = feed(criterion, rng.lognormal(0, 0.2, 5000))
    assert n is not None and "plateaued" in criterion.reason


def test_adaptive_criteria_time_out(rng):
    criterion = stopping.MedianPrecision(0.0001, 0.95, stopping.Bounds(10, 0.0, 0.05))
    n = feed(criterion, rng.lognormal(0, 0.5, 1000), step_s=0.01)
    assert n == 6 and criterion.reason.startswith("timeout")


def test_the_minimum_time_is_sampling_wall_time_not_the_samples_sum():
    """A 3 µs GPU kernel sampled once a millisecond: 20 ms of sampling is 20 samples (the
    samples' sum would need 6,667)."""
    criterion = stopping.MedianPrecision(0.01, 0.95, stopping.Bounds(5, 0.02, 60))
    n = feed(criterion, np.full(10_000, 3e-6), step_s=1e-3)
    assert 19 <= n <= 21 and "median precision" in criterion.reason


@pytest.mark.seed(20261205)  # two stopping times of random series, compared
def test_median_precision_needs_more_samples_when_noisier(rng):
    bounds = stopping.Bounds(10, 0.0, 1e9)
    quiet, loud = (stopping.MedianPrecision(0.01, 0.95, bounds) for _ in range(2))
    n_quiet = feed(quiet, rng.lognormal(0, 0.01, 5000))
    n_loud = feed(loud, rng.lognormal(0, 0.1, 5000))
    assert n_quiet < n_loud and "median precision" in loud.reason


def test_noise_floor_is_a_prediction_bound_of_log_ratios():
    # k = ceil(q·(n+1)): 3 of 4 at 0.5, the largest at 0.9 (and past n, still the largest).
    assert noise.floor_from_ratios([1.0, 1.0, 1.0, 1.1], 0.5) == pytest.approx(0.0)
    assert noise.floor_from_ratios([1.0, 1.2, 1.0, 1.1], 0.5) == pytest.approx(0.1)
    assert noise.floor_from_ratios([1 / 1.1, 1.0, 1.0, 1.05], 0.9) == pytest.approx(0.1)
    ratios = [1.0 + i / 100 for i in range(1, 21)]
    assert noise.floor_from_ratios(ratios, 0.95) == pytest.approx(0.20)
    assert noise.floor_from_ratios(ratios, 0.9) == pytest.approx(0.19)


def test_noise_floor_holds_a_further_ratio_with_its_quantile(rng):
    """Over many hosts' worth of 20 A/A rounds, a 21st ratio lands inside the floor in at
    least 95% of them (the interpolated quantile gave about 90%)."""
    trials, inside = 4000, 0
    for _ in range(trials):
        ratios = rng.lognormal(0, 0.05, 21)
        inside += abs(np.log(ratios[-1])) <= np.log1p(noise.floor_from_ratios(ratios[:20], 0.95))
    assert inside >= bounds.fewest_hits(trials, 20 / 21)  # exactly k/(n+1) = 20/21
    with pytest.raises(ValueError, match="rounds"):
        noise.a_a(lambda seed: None, rounds=2, quantile=0.95)


def _drifting_run(rng, repeats: int, drift: float, samples: int = 40):
    """One run on a host whose speed drifts between repeats (lognormal, sd ``drift``) far
    more than samples scatter within one: the samples and each repeat's median."""
    levels = rng.lognormal(0, drift, repeats)
    per_repeat = [level * rng.lognormal(0, 0.002, samples) for level in levels]
    return np.concatenate(per_repeat), [float(np.median(r)) for r in per_repeat]


@pytest.mark.seed(20261205)  # a Student-t interval, near its nominal 95% here
def test_reruns_land_in_the_run_to_run_interval_but_not_in_one_runs(rng):
    """Where drift between repeats dominates, two runs' medians fall inside each other's
    run-to-run interval ≥ 95% of the time; the samples' interval alone misses them."""
    inside = {"run-to-run": 0, "within-run": 0}
    trials = 300
    for _ in range(trials):
        runs = [_drifting_run(rng, 5, 0.03) for _ in range(2)]
        first = stats.summarize(runs[0][0], 0.95, runs[0][1])
        alone = stats.summarize(runs[0][0], 0.95)
        second = float(np.median(runs[1][0]))
        assert first["interval"] == "run-to-run" and first["repeats"] == 5
        assert alone["interval"] == "within-run" and alone["repeats"] == 1
        inside["run-to-run"] += first["ci_low_s"] <= second <= first["ci_high_s"]
        inside["within-run"] += alone["ci_low_s"] <= second <= alone["ci_high_s"]
    assert inside["run-to-run"] / trials >= 0.92  # 0.95 nominal, minus 300 trials' error
    assert inside["within-run"] / trials < 0.5


def test_the_run_to_run_interval_never_narrows_the_samples_interval(rng):
    samples, _ = _drifting_run(rng, 3, 0.0)
    wide = samples * rng.lognormal(0, 0.3, len(samples))
    medians = [float(np.median(wide[i::3])) for i in range(3)]
    one_run = stats.summarize(wide, 0.95)
    both = stats.summarize(wide, 0.95, medians)
    assert both["ci_low_s"] <= one_run["ci_low_s"] and both["ci_high_s"] >= one_run["ci_high_s"]


def test_a_rerun_interval_needs_two_repeats():
    with pytest.raises(ValueError, match="at least 2 repeats"):
        stats.rerun_interval([1.0], 1.0, 0.95)
    lo, hi = stats.rerun_interval([1.0, 1.1, 0.9], 1.0, 0.95)
    assert lo < 1.0 < hi and hi / 1.0 == pytest.approx(1.0 / lo)


def test_a_recorded_floor_widens_the_interval_to_where_a_rerun_lands(rng):
    samples = rng.lognormal(0, 0.001, 50)
    tight = stats.summarize(samples, 0.95)
    floored = stats.summarize(samples, 0.95, floor=0.1)
    median = floored["median_s"]
    assert tight["interval"] == "within-run" and tight["floor_applied"] is None
    assert floored["interval"] == "run-to-run" and floored["floor_applied"] == 0.1
    assert floored["ci_low_s"] == pytest.approx(median / 1.1)
    assert floored["ci_high_s"] == pytest.approx(median * 1.1)
    wide = rng.lognormal(0, 0.5, 50)  # samples wider than the floor keep their own interval
    assert stats.summarize(wide, 0.95, floor=0.01)["ci_low_s"] == stats.median_interval(
        wide, 0.95)[0]
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="noise floor"):
            stats.summarize(samples, 0.95, floor=bad)


def test_no_floor_is_finer_than_one_step_of_its_clock():
    """The H200's A/A workload: every sample one reading of the 32 ns timer, every ratio 1."""
    quantized = noise.resolved(noise.floor_from_ratios([1.0] * 6, 0.95), 32e-9, 3.168e-6)
    assert quantized["noise_floor"] == pytest.approx(32e-9 / 3.168e-6)
    assert quantized["floor_set_by"] == "clock resolution"
    spread = noise.resolved(0.05, 32e-9, 3.168e-6)
    assert spread["noise_floor"] == 0.05 and spread["floor_set_by"] == "ratios"


def test_a_share_has_an_exact_interval_that_never_excludes_what_it_saw():
    low, high = stats.share_interval(0, 1000, 0.95)
    assert low == 0.0 and 0.0036 < high < 0.0037  # 1 - 0.025 ** (1 / 1000)
    low, high = stats.share_interval(5, 1000, 0.95)
    assert low < 0.005 < high and high < stats.share_interval(5, 200, 0.95)[1]
    assert stats.share_interval(1000, 1000, 0.95)[1] == 1.0
    with pytest.raises(ValueError, match="not a share"):
        stats.share_interval(3, 2, 0.95)
