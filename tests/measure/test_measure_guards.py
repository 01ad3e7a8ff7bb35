"""The reuse guard: a stall on a loaded host does not accuse honest code; a result reused
across samples is still refused. Timed through a fake clock (a call costs what work it
did, plus the stalls a test schedules), so nothing here depends on this host's load."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from casebook.measure import engine, guards
from casebook.measure.clocks import Timing
from casebook.stages import timing
from kernels.contract import Runnable

pytestmark = pytest.mark.timeout(120)
WORK_S = 1e-3  # what the samples measured: one unit of work
STALL_S = 20e-3  # a preemption on a loaded host: many times the call
OVERHEAD_S = 1e-6  # a call that does no work: a lookup


class Clock:
    """A fake measuring clock: a call takes WORK_S per unit of work it did, plus STALL_S
    if its number (1, 2, ... in the guard's order) is in ``stalls``."""

    def __init__(self, stalls=()):
        self.work, self.calls, self.stalls = 0, 0, set(stalls)

    def time_call(self, runnable: Runnable):
        def time_call(args):
            before = self.work
            out = runnable.call(*args)
            self.calls += 1
            stall = STALL_S if self.calls in self.stalls else 0.0
            return out, (self.work - before) * WORK_S + OVERHEAD_S + stall
        return time_call


# The guard's calls: 1-3 the first calls on PROBES fresh sets; re-check k (from 1) calls
# the sampled set (4k), its fresh set for the first time (4k + 1), the sampled set twice.
FIRST_PASS = range(1, guards.PROBES + 1)
RECHECK_FIRSTS = [4 * k + 1 for k in range(1, guards.RECHECKS + 1)]


def runnable(call) -> Runnable:
    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=np.asarray, execution={})


def honest(clock: Clock) -> Runnable:
    def call(x):
        clock.work += 1
        return x * 2
    return runnable(call)


def cached_by_identity(clock: Clock, uses_before_caching: int = 1) -> Runnable:
    """Works on a set of inputs until it has seen it ``uses_before_caching`` times, then
    returns the saved result."""
    seen, saved = {}, {}

    def call(x):
        seen[id(x)] = seen.get(id(x), 0) + 1
        if id(x) not in saved:
            clock.work += 1
            result = x * 2
            if seen[id(x)] >= uses_before_caching:
                saved[id(x)] = result
            return result
        return saved[id(x)]
    return runnable(call)


def check(make, stalls=(), calls_before: int = 0) -> dict:
    """The reuse guard on ``make``'s runnable: the sampled set is called
    ``calls_before`` times first (the samples), every set has fresh random inputs."""
    rng = np.random.default_rng()
    clock = Clock(stalls)
    r = make(clock)
    sampled = (rng.standard_normal(64),)
    for _ in range(calls_before):
        r.call(*sampled)
    median = WORK_S if make is honest else OVERHEAD_S  # what the samples measured
    return guards.reused_result(r, sampled, lambda: (rng.standard_normal(64),),
                                clock.time_call(r), median)


def test_honest_work_passes_without_a_recheck():
    assert check(honest)["rechecks"] == 0


def test_a_stall_on_every_first_call_is_cleared_by_a_recheck():
    assert check(honest, stalls=FIRST_PASS)["rechecks"] == 1


def test_stalls_are_cleared_by_the_last_recheck():
    result = check(honest, stalls=[*FIRST_PASS, *RECHECK_FIRSTS[:-1]])
    assert result["rechecks"] == guards.RECHECKS and "a stall" in result["detail"]


def test_a_host_loaded_through_the_whole_guard_is_not_accused():
    """Samples taken on a quiet host, every guard call 21× slower: the incident."""
    assert check(honest, stalls=range(1, 100))["rechecks"] == 1


def test_a_stall_on_every_recheck_is_refused():
    """The limit: a stall on the first call of every re-check looks like a reuse (it
    comes with probability p^RECHECKS; benchmarks/reuse_guard_load.py measures p)."""
    with pytest.raises(guards.TimerFooled, match=f"on each of {guards.RECHECKS} re-checks"):
        check(honest, stalls=[*FIRST_PASS, *RECHECK_FIRSTS])


@pytest.mark.parametrize("stalls", [(), [4 * k for k in range(1, guards.RECHECKS + 1)]],
                         ids=["quiet", "a stalled reference call in every re-check"])
def test_a_result_cached_by_identity_is_refused(stalls):
    with pytest.raises(guards.TimerFooled, match="reused across samples: first calls"):
        check(lambda clock: cached_by_identity(clock), stalls=stalls, calls_before=1)


def test_a_cache_that_waits_for_repeats_is_refused():
    """Caching only from a set's fourth call: the re-checks' calls on the sampled set,
    not repeats on the fresh set, are what a first call is compared with."""
    with pytest.raises(guards.TimerFooled, match="reused across samples: first calls"):
        check(lambda clock: cached_by_identity(clock, uses_before_caching=4),
              calls_before=10)


def test_a_transient_stall_at_the_guard_does_not_fail_a_measurement():
    """An honest runnable whose first calls on the first PROBES fresh input sets after
    sampling stall (a load spike as the guard begins) is measured, with a re-check."""
    seen: list[int] = []

    def call(x):
        if id(x) not in seen:
            seen.append(id(x))  # the sampled set first, then the guard's fresh sets
            if 2 <= len(seen) <= 1 + guards.PROBES:
                time.sleep(STALL_S)
        time.sleep(WORK_S)
        return x * 2

    settings = timing.default_settings(warmup_calls=2, criterion="fixed_count", count=15,
                                       repeats=1)
    m = engine.measure(engine.Workload(runnable(call), lambda rng: {
        "x": rng.standard_normal(64)}), settings, "hot", 1, engine.Devices(None, "test"))
    assert m.guards["reused_result"]["rechecks"] >= 1


LAG_S = 3e-3  # far above the early-return guard's margins at a 1 ms median


def test_an_early_return_lag_that_does_not_repeat_is_a_stall_not_a_cheat(rng):
    """Two of the first probe set's immediate fetches stall (calls 1 and 3 of fetch):
    the first probe lags, its repeat does not, and the honest runnable passes."""
    fetches = []

    def fetch(out):
        fetches.append(None)
        if len(fetches) in (1, 3):
            time.sleep(LAG_S)
        return np.asarray(out)

    stalled = Runnable(prepare=lambda d: (d["x"],), call=lambda x: x * 2,
                       sync=lambda out: None, fetch=fetch, execution={})
    found = guards.early_return(stalled, (rng.standard_normal(8),), WORK_S)
    assert found["passed"] and "(2 probe(s))" in found["detail"]


def leaving_pending(seconds: float, calls: list | None = None) -> Runnable:
    """A call that leaves ``seconds`` of work pending on a thread, which its output's
    fetch waits for (a cheat when ``seconds`` > 0); each call is appended to ``calls``."""

    def call(x):
        if calls is not None:
            calls.append(None)
        worker = threading.Thread(target=time.sleep, args=(seconds,))
        worker.start()
        return worker, x * 2

    def fetch(out):
        out[0].join()
        return out[1]

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=fetch, execution={})


def test_an_early_return_that_lags_on_every_probe_is_refused(rng):
    """The call leaves its work pending on a thread; every probe's immediate fetch waits
    for it, so every repeat lags and the guard refuses."""
    cheat = leaving_pending(LAG_S)
    with pytest.raises(guards.TimerFooled, match=f"on each of {guards.RECHECKS + 1} probes"):
        guards.early_return(cheat, (rng.standard_normal(8),), WORK_S)


SLOW_S = 0.2  # a median past guards.SLOW_CALL_S: one probe decides


@pytest.mark.parametrize("pending", [0.0, 0.1])
def test_a_slow_call_takes_one_early_return_probe_and_a_cheat_is_still_refused(rng, pending):
    """At a median of seconds-per-call scale a probe is one round of two calls (three
    below it): honest work passes; work left pending (a cheat) lags on every probe. How
    many probes honest work takes depends on the host's load (a stalled fetch is
    re-probed), so the test holds the calls to the probes, whatever their number."""
    calls = []
    runnable = leaving_pending(pending, calls)
    if not pending:
        found = guards.early_return(runnable, (rng.standard_normal(8),), SLOW_S)
        probes = int(re.search(r"\((\d+) probe\(s\)\)", found["detail"])[1])
        assert found["passed"] and len(calls) == 2 * probes
        return
    with pytest.raises(guards.TimerFooled, match=f"on each of {guards.RECHECKS + 1} probes"):
        guards.early_return(runnable, (rng.standard_normal(8),), SLOW_S)
    assert len(calls) == 2 * (guards.RECHECKS + 1)


class Chip:
    """A fake chip whose clock reads the programs it ran while a block ran (as a TPU
    trace does); a fetch's host time is noise there (it sleeps a random stall)."""

    def __init__(self, rng):
        self.ran: list[float] = []
        self.rng = rng

    def device_seconds(self, block) -> float:
        before = len(self.ran)
        block()
        return sum(self.ran[before:])

    def fetched(self, value):
        time.sleep(float(self.rng.uniform(0, LAG_S)))  # a slow, noisy host transfer
        return np.asarray(value)


def on_chip(chip: Chip, deferred: float, relayout: float = 0.0) -> Runnable:
    """A call running WORK_S of programs, ``deferred`` of them only once its output is
    fetched (a cheat when > 0), and ``relayout`` more programs at each fetch."""
    def call(x):
        chip.ran.append(WORK_S - deferred)
        return x * 2

    def fetch(out):
        chip.ran.extend(p for p in (deferred, relayout) if p)
        return chip.fetched(out)

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=fetch, execution={})


@pytest.mark.parametrize("relayout", [0.0, 0.1 * WORK_S])
def test_on_a_clock_of_the_chips_programs_a_noisy_fetch_does_not_accuse_honest_work(
        rng, relayout):
    """The fetch's host time lags by up to LAG_S, three times the work; the guard reads
    the device's programs, and a fetch's own small program (a relayout) is no early
    return."""
    chip = Chip(rng)
    found = guards.early_return(on_chip(chip, 0.0, relayout), (rng.standard_normal(8),),
                                WORK_S, chip.device_seconds)
    assert found["passed"] and "(1 probe(s), the clock's own programs)" in found["detail"]


@pytest.mark.parametrize("deferred", [WORK_S, 0.5 * WORK_S])
def test_on_a_clock_of_the_chips_programs_work_left_for_the_fetch_is_refused(rng, deferred):
    chip = Chip(rng)
    with pytest.raises(guards.TimerFooled,
                       match=f"ran at least {deferred * 1e3:.3g} ms more work when its "
                             f"output was fetched.*on each of {guards.RECHECKS + 1} probes"):
        guards.early_return(on_chip(chip, deferred), (rng.standard_normal(8),),
                            WORK_S - deferred, chip.device_seconds)


def partly_cached(clock: Clock) -> Runnable:
    """Four units of work on a set's first call, one on each later call: a reuse whose
    samples still take a median past SLOW_CALL_S (when a unit takes SLOW_S)."""
    seen = set()

    def call(x):
        clock.work += 1 if id(x) in seen else 4
        seen.add(id(x))
        return x * 2
    return runnable(call)


@pytest.mark.parametrize("make", [honest, partly_cached])
def test_a_slow_call_takes_two_fresh_sets_and_a_reuse_is_still_refused(rng, make):
    """At a median past SLOW_CALL_S two fresh sets decide: honest work passes on them; a
    reuse is slow on their first calls and on every re-check."""
    clock = Clock()
    r = make(clock)
    sampled = (rng.standard_normal(64),)
    r.call(*sampled)  # the samples

    def time_call(args):  # a unit of work takes SLOW_S
        out, seconds = clock.time_call(r)(args)
        return out, seconds * SLOW_S / WORK_S

    def check_it():
        return guards.reused_result(r, sampled, lambda: (rng.standard_normal(64),),
                                    time_call, SLOW_S)
    calls = clock.calls
    if make is honest:
        found = check_it()
        assert found["rechecks"] == 0 and "on 2 fresh input sets" in found["detail"]
        assert clock.calls - calls == guards.SLOW_FRESH_SETS
        return
    with pytest.raises(guards.TimerFooled, match=f"on each of {guards.RECHECKS} re-checks"):
        check_it()


def timings_of(rng, stalled: int) -> list[Timing]:
    """15 samples of 15–25 µs, ``stalled`` of them with ms of work outside the window."""
    timed = rng.uniform(15e-6, 25e-6, 15)
    unseen = np.zeros(15)
    unseen[rng.choice(15, stalled, replace=False)] = rng.uniform(0.5e-3, 3e-3, stalled)
    return [Timing(seconds=t, host_s=t, unseen_s=u) for t, u in zip(timed, unseen,
                                                                     strict=True)]


@pytest.mark.parametrize("stalled", [1, 3, 7, 8, 15])
def test_unseen_work_is_judged_on_the_median_sample(rng, stalled):
    """A few samples whose barrier was preempted (ms each, on a loaded host) pass; device
    work left outside the window by most calls, in every re-check's series too, is
    refused."""
    timings = timings_of(rng, stalled)
    median = float(np.median([t.seconds for t in timings]))
    honest_runnable = runnable(lambda x: x * 2)
    series = []

    def again(n: int) -> list[Timing]:
        series.append(n)
        return timings_of(rng, stalled)[:n]

    if stalled < 8:
        found = guards.unseen_work(honest_runnable, (), timings, median, again)
        assert found["passed"] and "0 µs in the median sample" in found["detail"]
        assert series == []
    else:
        with pytest.raises(guards.TimerFooled, match=f"in the median sample .* and so on "
                                                     f"each of {guards.RECHECKS} re-checks"):
            guards.unseen_work(honest_runnable, (), timings, median, again)
        assert series == [15] * guards.RECHECKS


def test_unseen_work_in_one_series_is_a_stall_not_a_cheat(rng):
    """Most samples of one series saw work outside the window (a barrier preempted
    through a burst of load); the re-check's series did not: passed, and said so."""
    found = guards.unseen_work(runnable(lambda x: x * 2), (), timings_of(rng, 15), 20e-6,
                               lambda n: timings_of(rng, 0)[:n])
    assert found["passed"] and "a stall: not so on re-check 1" in found["detail"]


# A preempted barrier, in the test that stalls one on purpose: long enough that no stall
# of this host's own (one of the idle barriers the probe subtracts, on a loaded host:
# seen once in 12 hunt runs at 3 ms) can hide it.
BARRIER_STALL_S = 0.1


def with_barrier(call_leaves_s: float, stalled_barriers=()) -> Runnable:
    """A call that leaves ``call_leaves_s`` of work for the device-wide barrier (a side
    stream: a cheat when > 0), and a barrier that also stalls BARRIER_STALL_S on its calls
    numbered in ``stalled_barriers`` (1, 2, ...: a preempted barrier on a loaded host)."""
    pending, barriers = [0.0], []

    def call(x):
        pending[0] = call_leaves_s
        return x * 2

    def barrier():
        barriers.append(None)
        time.sleep(pending[0] + (BARRIER_STALL_S if len(barriers) in stalled_barriers else 0))
        pending[0] = 0.0

    return runnable(call)._replace(barrier=barrier)


def test_work_left_for_the_barrier_by_every_call_is_refused(rng):
    """Every probe starts on a drained device, and the barrier after each call still
    waits LAG_S: refused on every probe, however slow the samples were (their median,
    here 50 ms, does not widen the margin: the probe's own calls are the reference)."""
    timings = timings_of(rng, 0)
    with pytest.raises(guards.TimerFooled, match=f"on each of {guards.RECHECKS + 1} probes"):
        guards.unseen_work(with_barrier(LAG_S), (rng.standard_normal(8),), timings, 0.05,
                           lambda n: timings[:n])


def test_a_barrier_that_stalls_once_is_not_a_cheat(rng):
    """The first probe's drains (barrier calls 3 and 6: each of its calls comes after a
    barrier that settles the device and one timed on it, idle) stall; a repeat probe does
    not: passed."""
    timings = timings_of(rng, 0)
    found = guards.unseen_work(with_barrier(0.0, stalled_barriers=(3, 6)),
                               (rng.standard_normal(8),), timings, 20e-6,
                               lambda n: timings[:n])
    probes = int(re.search(r"\((\d+) probe\(s\)\)", found["detail"])[1])
    assert found["passed"] and probes >= 2


def test_work_hidden_in_a_few_calls_is_refused_and_a_stall_is_not():
    """One call in four does four calls' work (batch-and-skip) in every series: refused
    after RECHECKS re-checks; one stalled sample of 60 calls' time, gone on the re-check:
    passed after one. The samples are given, not timed: nothing here depends on load."""
    batched = [0.0, 0.0, 0.0, 4 * WORK_S] * 4
    with pytest.raises(guards.TimerFooled, match=f"on each of {guards.RECHECKS} re-checks"):
        guards.work_per_call(batched, lambda n: batched[:n], on_host=True)
    stalled = [WORK_S] * 14 + [60 * WORK_S]
    found = guards.work_per_call(stalled, lambda n: [WORK_S] * n, on_host=True)
    assert found["passed"] and found["rechecks"] == 1
    # On the host clock a skew must also exceed SKEW_HOST_S: 1 µs calls with one 20 µs
    # stall in every series are no accusation there, but are on a device clock.
    tiny = [1e-6] * 14 + [20e-6]
    assert guards.work_per_call(tiny, lambda n: tiny[:n], on_host=True)["rechecks"] == 0
    with pytest.raises(guards.TimerFooled):
        guards.work_per_call([1e-6] * 14 + [1e-3], lambda n: ([1e-6] * 14 + [1e-3])[:n],
                             on_host=False)
