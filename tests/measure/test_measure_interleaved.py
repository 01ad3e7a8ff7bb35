"""Interleaved (paired) measurement: workloads sampled round by round in a shuffled
order, the paired ratio of medians, the paired A/A floor; on a host made to drift."""

from __future__ import annotations

import math
import time

import bounds
import fakes
import numpy as np
import pytest

from casebook.measure import engine, guards, noise, stats
from casebook.stages import timing
from kernels.contract import Runnable

pytestmark = [pytest.mark.timeout(120), pytest.mark.host_rehearsal]
CPU = engine.Devices(None, "no GPU: test")
FIXED = timing.default_settings(warmup_calls=1, criterion="fixed_count", count=15, repeats=1)
WORK_S = 0.002


def inputs(rng):
    return {"x": rng.standard_normal(16)}


def drifting_host(slope: float):
    """Runnables sharing one host whose speed falls with every call it makes (a slow,
    steady drift): call i takes WORK_S·scale·(1 + slope·i) on the host's own clock
    (``VIRTUAL``), so no preemption of a loaded test machine moves a sample."""
    host = {"calls": 0, "order": []}

    def runnable(name: str, scale: float = 1.0) -> Runnable:
        def call(x):
            host["order"].append(name)
            HostTime.last = WORK_S * scale * (1 + slope * host["calls"])
            host["calls"] += 1
            return x * 2

        return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                        fetch=np.asarray, execution={})

    return host, runnable


HostTime = fakes.BookedTime
VIRTUAL = fakes.BOOKED


def median_ratio(a: engine.Measurement, b: engine.Measurement) -> float:
    return float(np.median(a.kept) / np.median(b.kept))


def test_interleaving_cancels_the_drift_that_separate_measurements_carry():
    _, runnable = drifting_host(slope=0.02)
    first = engine.measure(engine.Workload(runnable("A"), inputs), FIXED, "hot", 1, VIRTUAL)
    second = engine.measure(engine.Workload(runnable("A'"), inputs), FIXED, "hot", 2, VIRTUAL)
    separate = median_ratio(first, second)
    assert separate < 0.85  # the same work, measured later, looks much slower

    _, runnable = drifting_host(slope=0.02)
    both = engine.measure_interleaved(
        {"A": engine.Workload(runnable("A"), inputs),
         "A'": engine.Workload(runnable("A'"), inputs)}, FIXED, "hot", 1, VIRTUAL)
    a, b = stats.paired_rounds(both["A"].kept_by_round, both["A'"].kept_by_round)
    assert len(a) == 15
    ratio, low, high = stats.paired_ratio(a, b, 0.95)
    assert abs(math.log(ratio)) < 0.05 and low <= ratio <= high


def test_every_round_holds_every_workload_once_in_a_shuffled_order():
    host, runnable = drifting_host(slope=0.0)
    names = ["x", "y", "z"]
    out = engine.measure_interleaved(
        {n: engine.Workload(runnable(n), inputs) for n in names}, FIXED, "hot", 7, VIRTUAL)
    for n in names:
        rounds = [r["round"] for r in out[n].rows]
        assert rounds == list(range(15)) and len(out[n].kept) == 15
        assert all(g["passed"] for g in out[n].guards.values())
        assert "interleaved with 2 other workload(s), 15 rounds" in out[n].stop_reason
    sampled = host["order"][len(names):len(names) + 15 * 3]  # after one warm-up each
    firsts = {tuple(sampled[i:i + 3]) for i in range(0, len(sampled), 3)}
    assert all(sorted(f) == names for f in firsts) and len(firsts) > 1


def test_sampling_goes_on_until_the_slowest_criterion_stops():
    """A steady workload meets a ±1% median at its fifth sample, a noisy one (each call
    0.5-1.5× its time) needs many more: both take as many as the noisy one."""
    host, runnable = drifting_host(slope=0.0)
    adaptive = timing.default_settings(warmup_calls=1, criterion="median_precision",
                                       target=0.01, min_samples=5, min_time_s=0.0,
                                       timeout_s=60, repeats=1)
    jitter = np.random.default_rng(5)
    steady, noisy = runnable("steady"), runnable("noisy")

    def shaken(x):
        out = noisy.call(x)
        HostTime.last *= 0.5 + jitter.random()
        return out

    out = engine.measure_interleaved(
        {"steady": engine.Workload(steady, inputs),
         "noisy": engine.Workload(noisy._replace(call=shaken), inputs)},
        adaptive, "hot", 3, VIRTUAL)
    assert len(out["steady"].kept) == len(out["noisy"].kept) > 50
    assert "median precision" in out["noisy"].stop_reason
    assert host["order"].count("steady") == host["order"].count("noisy")


def test_a_cheat_among_interleaved_workloads_is_caught_by_its_own_guard():
    _, runnable = drifting_host(slope=0.0)
    memo = {}

    def cached(x):
        key = x.tobytes()
        if key not in memo:
            time.sleep(0.01)
            memo[key] = x * 2
        return memo[key]

    cheat = runnable("cheat")._replace(call=cached)
    with pytest.raises(guards.TimerFooled, match="reused across samples"):
        engine.measure_interleaved(
            {"honest": engine.Workload(runnable("honest"), inputs),
             "cheat": engine.Workload(cheat, inputs)}, FIXED, "hot", 1, CPU)


def gpu_runnable(device: fakes.Device, duration_ns: int, stream: int) -> Runnable:
    def call(x):
        device.launch(duration_ns, stream=stream)
        return x * 2

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=np.asarray, execution={}, stream=stream)


def test_one_cupti_clock_times_each_gpu_workload_as_its_own():
    device = fakes.Device()
    tools = fakes.tools(device)
    out = engine.measure_interleaved(
        {"short": engine.Workload(gpu_runnable(device, 20_000, stream=1), inputs),
         "long": engine.Workload(gpu_runnable(device, 40_000, stream=2), inputs)},
        FIXED, "hot", 1, engine.Devices(tools))
    assert {m.clock_kind for m in out.values()} == {"cupti_kernel"} and tools.cupti.finalized
    a, b = stats.paired_rounds(out["long"].kept_by_round, out["short"].kept_by_round)
    assert stats.paired_ratio(a, b, 0.95) == pytest.approx((2.0, 2.0, 2.0))


def test_cuda_events_refuse_workloads_on_different_streams():
    device = fakes.Device()
    tools = fakes.tools(device, cupti=False)
    with pytest.raises(guards.Unmeasurable, match="different streams"):
        engine.measure_interleaved(
            {"a": engine.Workload(gpu_runnable(device, 20_000, stream=1), inputs),
             "b": engine.Workload(gpu_runnable(device, 20_000, stream=2), inputs)},
            FIXED, "hot", 1, engine.Devices(tools))
    with pytest.raises(ValueError, match="at least one workload"):
        engine.measure_interleaved({}, FIXED, "hot", 1, CPU)


def drifting_pair(rng, rounds: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Samples of a workload and one 1.1× as slow, taken in the same rounds of a host
    whose speed follows a random walk."""
    drift = np.exp(np.cumsum(rng.normal(0, 0.05, rounds)))
    return (1e-3 * drift * rng.lognormal(0, 0.01, rounds),
            1.1e-3 * drift * rng.lognormal(0, 0.01, rounds))


def test_the_paired_interval_holds_the_true_ratio_at_its_confidence(rng):
    trials = 400
    held = sum(low <= 1.1 <= high for low, high in (
        stats.paired_ratio(b, a, 0.95)[1:] for a, b in (drifting_pair(rng)
                                                         for _ in range(trials))))
    # The per-round ratios are independent and the median's interval distribution-free:
    # ≥ 95% by construction, less what 400 trials may miss (bounds.MISS)
    assert held >= bounds.fewest_hits(trials, 0.95)


def test_paired_ratio_cancels_drift_per_round_and_refuses_unpaired_series(rng):
    a, b = drifting_pair(rng)
    ratio, low, high = stats.paired_ratio(b, a, 0.95)
    # One draw misses 1.1 in up to 5% of runs (its confidence); it is never far off.
    assert abs(math.log(ratio / 1.1)) < 0.01 and high / low < 1.02
    _, sep_low, sep_high = stats.ratio_of_medians(b, a, 0.95)
    # Unpaired, the drift swamps the interval.
    assert math.log(sep_high / sep_low) > 3 * math.log(high / low)
    c = stats.compare_paired(a, b, 0.95, floor=0.02)
    assert c.design == "paired" and c.verdict == stats.FASTER and c.printable
    assert c.as_dict()["design"] == "paired"
    same = stats.compare_paired(a, a * rng.lognormal(0, 0.001, 200), 0.95, floor=0.02)
    assert same.verdict == stats.SAME
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_ratio(a, a[:-1], 0.95)
    with pytest.raises(ValueError, match="at least 5"):
        stats.paired_ratio(a[:4], a[:4], 0.95)
    assert stats.paired_rounds({0: 1.0, 1: 2.0, 3: 4.0}, {1: 5.0, 3: 6.0, 4: 7.0}) == (
        [2.0, 4.0], [5.0, 6.0])


def test_paired_a_a_floor_of_interleaved_measurements():
    _, runnable = drifting_host(slope=0.01)
    seeds = []

    def pair(seed):
        seeds.append(seed)
        return engine.measure_interleaved(
            {"A": engine.Workload(runnable("A"), inputs),
             "A'": engine.Workload(runnable("A'"), inputs)}, FIXED, "hot", seed, VIRTUAL)

    result = noise.a_a_paired(pair, rounds=4, quantile=0.75)
    assert seeds == [0, 1, 2, 3] and len(result["ratios"]) == 4
    assert result["samples_per_series"] == 15
    # The protocol's floor is its ratios' bound (how small it gets on a drifting host is
    # test_interleaving_cancels_...; here a loaded test host may preempt any busy wait).
    assert result["noise_floor"] == noise.floor_from_ratios(result["ratios"], 0.75)
    assert all(0.5 < r < 2 for r in result["ratios"])  # the host slowed ~4× over the run
    with pytest.raises(ValueError, match="at least 4"):
        noise.a_a_paired(pair, rounds=3, quantile=0.75)
