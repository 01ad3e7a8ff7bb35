"""Guards against a timer being fooled, each run after sampling with fresh probes.

- early return: a call whose wait returns before the work is done. Fetching the output
  right after the wait must cost no more than fetching an output left to settle. Where
  the clock reads the device's own programs (a TPU trace), the device work of a call,
  its wait and its fetch together must be no more than a sample's: a fetch's host time
  there is no measure (an 8192² bf16 output took 190–245 ms to fetch, ±25 ms, against a
  5.9 ms call; benchmarks/results/tpu_guard_probe.json), and a program still running
  when a trace stops is read as lasting 0 s.
- unseen stream: work the timed window never saw. Device clocks report it per sample
  (``Timing.unseen_s``); a runnable's device-wide ``barrier`` right after the wait must
  find nothing left to drain.
  Both probes start on a drained device (the barrier, where there is one) and judge a lag
  against the smaller of the median sample and their own calls: samples slowed by the
  backlog a cheat leaves behind must not widen the margin that would catch it.
- cached result: a result reused across samples. The first call on fresh input sets
  must not be several times slower than the samples, and two different input sets must
  give different outputs.

- work per call: samples whose median hides the work, as when one call in N does the work
  of N (batch-and-skip: github.com/gpu-mode/reference-kernels/pull/104). Their mean must
  not be several times their median.
- timed output: a call that is right when checked and wrong when timed (it detects the
  warm-up or the check). The output of one sample, drawn at random as sampling goes, is
  fetched after its wait and checked after sampling against the oracle on its inputs,
  drawn again.
- inputs intact: a call that changes its inputs (zeroes them, keeps state in them). Every
  sampled input set's host-readable arguments hash the same after sampling as prepared.
- tampering (``tamper``): a call that replaced the clock or the statistics.

Every timing-based accusation is re-checked before it is refused (RECHECKS): a cheat
shows on every probe, a stall on a loaded host on one, so a stall does not accuse honest
code.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from casebook.measure.clocks import Timing, now_ns
from kernels.contract import Runnable

# A guard fails only on a lag larger than this share of the median sample AND larger
# than ABSOLUTE_S: honest calls differ by copy and allocator jitter, a cheat by the work.
LAG_SHARE = 0.25
ABSOLUTE_S = 50e-6
# First calls on fresh inputs may be slower (allocation, a cold cache): up to 3x is
# honest; a reused result is orders of magnitude faster than the work it skips.
REUSE_FACTOR = 3.0
# A first call on new buffers also pays a fixed dispatch and first-touch cost, whatever
# the work: 60–70 µs was measured for a jitted JAX call on a CPU host (3.5× a 64×64
# matmul). A reuse is claimed only when the first call is slower by more than this.
FRESH_INPUT_S = 250e-6
# Re-checks of a suspected reuse, each on a further fresh input set: a reused result
# makes every first call slow (the work the samples skipped is done then), a stall on a
# loaded host (a preemption of a few ms, many times a sub-ms call) only some. A
# re-check times the first call on its set between calls on the sampled set (one
# before, two after; their median is what the samples timed, under the load of the
# moment, and one stalled call cannot move it); a refusal needs every re-check slow. A
# stall hits a re-check with probability p, so 5 of them leave p^5: beside a burner on
# every core, benchmarks/reuse_guard_load.py measured p = 17/76 (p^5 ~ 6e-4) for a numpy
# matmul whose first pass was slow in 59 of 200 honest runs; none was refused. The
# early-return and barrier probes repeat on a lag the same way (_persistent_lag): an
# honest jitted XLA matmul (0.14 ms) once lagged 56 µs on an idle 2-core host.
RECHECKS = 5
# Share of the median sample that device clocks may see outside the window (barrier and
# flush jitter) in the median sample before the samples are said to miss work. The median:
# work on a stream the timer does not see is left by every call, a stall of the measuring
# process (a barrier preempted for ms on a loaded host) inflates a few samples' barriers.
UNSEEN_SHARE = 0.05
PROBES = 3
# Samples whose mean is this many times their median hide work in a few calls: one call
# in N (4 or more) doing N calls' work puts the median on a call that skips, far below the
# mean. A busy host's stalls add to a mean too: an honest threaded 2 ms matmul was judged
# twice its median on 6 series in a row in a burst of load (the exploit corpus, factor 2
# then). A suspicion is re-checked on fresh series of as many calls, RECHECK_PAUSES apart.
SKEW_FACTOR = 4.0
# ...and whose mean exceeds the median by more than this. On the host clock stalls of a
# loaded host do move a mean this far from a short call's median, on every re-check: in a
# SLURM test's noise floor a 40 µs jitted matmul's mean was 4.5× its median (0.18 ms),
# on each of 5 re-checks of 118 calls. They do not reach a quarter of a millisecond (a
# reuse's margin, FRESH_INPUT_S); a device clock's samples hold no host stall.
SKEW_HOST_S = FRESH_INPUT_S
# Between re-checks of a skew: ten medians, within these bounds; a burst of load that
# lasts through them all is unlikely, a cheat's skew lasts through anything.
RECHECK_PAUSES = (0.02, 0.5)
# From this median on, one early-return probe (two calls and a settling pause of a
# median) decides as well as three, and two fresh sets (the fewest whose outputs can be
# compared) as well as three for the reuse guard: the margins, LAG_SHARE (25 ms and up)
# and REUSE_FACTOR of the median, are far above any fetch jitter or first-call cost, and
# a suspicion is re-checked all the same. An interpret-mode kernel takes seconds a call.
SLOW_CALL_S = 0.1
SLOW_FRESH_SETS = 2


class Unmeasurable(RuntimeError):
    """No trustworthy measurement can be made; the message says why."""


class TimerFooled(Unmeasurable):
    """The measured call fooled the timer; the message says how. ``refusals``: each guard
    that refused it, by name, with its message (empty where one guard was run alone)."""

    def __init__(self, message: str, refusals: dict[str, str] | None = None):
        super().__init__(message)
        self.refusals = dict(refusals or {})

    @classmethod
    def by(cls, refusals: dict[str, str]) -> TimerFooled:
        """One refusal naming every guard that refused, each message after its name."""
        return cls("; ".join(f"{name}: {why}" for name, why in refusals.items()), refusals)


def _seconds(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = now_ns()
    value = fn()
    return value, (now_ns() - start) * 1e-9


def _too_slow(lag: float, reference: float) -> bool:
    return lag > max(LAG_SHARE * reference, ABSOLUTE_S)


def _waited(runnable: Runnable, args: tuple[Any, ...]) -> Any:
    """One call on ``args`` and its wait; the output."""
    out = runnable.call(*args)
    runnable.sync(out)
    return out


def _settled(runnable: Runnable) -> None:
    """Drain what earlier calls left behind (the device-wide barrier, where the runnable
    has one), so that a probe times its own call and not the backlog of the samples."""
    if runnable.barrier is not None:
        runnable.barrier()


def _persistent_lag(probe: Callable[[], tuple[float, float]], median: float
                    ) -> tuple[float, float, int]:
    """The smallest of ``probe``'s lags, the reference it was judged against, and how
    many probes ran. A probe gives its lag and the median of its own timed calls; the
    reference is the smaller of that and the ``median`` sample (samples slowed by their
    own backlog, as calls that leave work behind are on a loaded host, must not widen the
    margin). A probe that lags is repeated up to RECHECKS times, and the lag stands only
    if every repeat lags too: a cheat lags on every probe (its work is always pending), a
    stall on a loaded host delays one."""
    lags = []
    while not lags or (_too_slow(*lags[-1]) and len(lags) <= RECHECKS):
        lag, calls = probe()
        lags.append((lag, min(median, calls)))
    lag, reference = min(lags)
    return lag, reference, len(lags)


def early_return(runnable: Runnable, args: tuple[Any, ...], median: float,
                 device_seconds: Callable[[Callable[[], Any]], float] | None = None
                 ) -> dict[str, Any]:
    """Refuse a call whose wait returns before its work is done. ``device_seconds``: the
    clock's device work while a block runs (a clock that reads the chip's programs), to
    judge the call by the work its fetch still finds, not by the fetch's host time."""
    if device_seconds is not None:
        return _early_return_on_device(runnable, args, median, device_seconds)

    def fetch_lag() -> tuple[float, float]:
        immediate, settled, calls = [], [], []
        _settled(runnable)
        for _ in range(PROBES if median < SLOW_CALL_S else 1):
            out, called = _seconds(lambda: _waited(runnable, args))
            calls.append(called)
            _, fetch_now = _seconds(lambda out=out: runnable.fetch(out))
            immediate.append(fetch_now)
            out = runnable.call(*args)
            runnable.sync(out)
            # Let anything pending finish: work pending past this pause still shows a lag
            # of the pause, a median, 4x the LAG_SHARE margin.
            time.sleep(max(median, 2 * fetch_now, 0.005))
            settled.append(_seconds(lambda out=out: runnable.fetch(out))[1])
            _settled(runnable)
        return (statistics.median(immediate) - statistics.median(settled),
                statistics.median(calls))

    lag, reference, probes = _persistent_lag(fetch_lag, median)
    if _too_slow(lag, reference):
        raise TimerFooled(
            f"the call returns before its work is done: fetching its output right after "
            f"the wait took at least {lag * 1e3:.3g} ms longer than once it had settled, "
            f"on each of {probes} probes (median sample {median * 1e3:.3g} ms, a probe's "
            f"call {reference * 1e3:.3g} ms)")
    return {"passed": True, "detail": f"fetch after the wait lags a settled fetch by "
                                      f"{max(lag, 0) * 1e6:.3g} µs ({probes} probe(s))"}


def _early_return_on_device(runnable: Runnable, args: tuple[Any, ...], median: float,
                            device_seconds: Callable[[Callable[[], Any]], float]
                            ) -> dict[str, Any]:
    def work_lag() -> tuple[float, float]:
        fetched, waited = [], []
        for _ in range(PROBES):
            _settled(runnable)
            waited.append(device_seconds(lambda: _waited(runnable, args)))
            _settled(runnable)
            fetched.append(device_seconds(lambda: runnable.fetch(_waited(runnable, args))))
        return (statistics.median(fetched) - statistics.median(waited),
                statistics.median(waited))

    lag, reference, probes = _persistent_lag(work_lag, median)
    if _too_slow(lag, reference):
        raise TimerFooled(
            f"the call returns before its work is done: the device ran at least "
            f"{lag * 1e3:.3g} ms more work when its output was fetched inside the timed "
            f"window than when the window closed at the wait, on each of {probes} probes "
            f"(median sample {median * 1e3:.3g} ms, a probe's call {reference * 1e3:.3g} ms)")
    return {"passed": True, "detail": f"device work of call, wait and fetch beyond the call "
                                      f"and wait: {max(lag, 0) * 1e6:.3g} µs ({probes} "
                                      f"probe(s), the clock's own programs)"}


def _unseen(timings: Sequence[Timing]) -> tuple[bool, float, float]:
    """Whether the median sample of ``timings`` saw work outside its window; that work
    and the median sample."""
    unseen = float(np.median([t.unseen_s for t in timings]))
    median = float(np.median([t.seconds for t in timings]))
    return unseen > max(UNSEEN_SHARE * median, ABSOLUTE_S), unseen, median


def unseen_work(runnable: Runnable, args: tuple[Any, ...], timings: Sequence[Timing],
                median: float, series: Callable[[int], list[Timing]]) -> dict[str, Any]:
    """Refuse work the timer did not see: in the median sample (and so in each of
    RECHECKS further series of as many calls, ``series(n)``: a barrier preempted on a
    loaded host is a stall, work on another stream is left by every call), or left for
    a device-wide barrier right after the wait."""
    suspected, unseen, _ = _unseen(timings)
    rechecks = 0
    while suspected and rechecks < RECHECKS:
        rechecks += 1
        suspected, again, again_median = _unseen(series(len(timings)))
    if suspected:
        raise TimerFooled(
            f"work ran on a stream the timer does not see: in the median sample "
            f"{unseen * 1e3:.3g} ms of device work fell outside the timed window against "
            f"{median * 1e3:.3g} ms timed, and so on each of {RECHECKS} re-checks (the "
            f"last: {again * 1e3:.3g} ms against {again_median * 1e3:.3g} ms)")
    detail = (f"device work outside the window: {unseen * 1e6:.3g} µs in the median sample, "
              f"{sum(t.unseen_s for t in timings) * 1e6:.3g} µs over all"
              + (f" (a stall: not so on re-check {rechecks})" if rechecks else ""))
    if runnable.barrier is None:
        return {"passed": True, "detail": detail + "; the runnable has no device-wide "
                                                   "barrier beyond its own wait"}
    def drain() -> tuple[float, float]:
        """A barrier after the wait, beyond a barrier on the drained device (what a
        barrier costs with nothing to wait for: µs on an idle GPU, more on a busy host)."""
        drains, calls = [], []
        for _ in range(PROBES):
            _settled(runnable)
            idle = _seconds(runnable.barrier)[1]
            calls.append(_seconds(lambda: _waited(runnable, args))[1])
            drains.append(_seconds(runnable.barrier)[1] - idle)
        return statistics.median(drains), statistics.median(calls)

    lag, reference, probes = _persistent_lag(drain, median)
    if _too_slow(lag, reference):
        raise TimerFooled(
            f"work ran on a stream the timer does not see: a device-wide barrier after "
            f"the wait still took at least {lag * 1e3:.3g} ms, on each of {probes} probes "
            f"(median sample {median * 1e3:.3g} ms, a probe's call {reference * 1e3:.3g} ms)")
    return {"passed": True, "detail": detail + f"; barrier after the wait {lag * 1e6:.3g} µs "
                                               f"({probes} probe(s))"}


def _arrays(output: Any) -> list[np.ndarray]:
    """A fetched output (one array or named arrays) as a list of arrays, in name order."""
    if isinstance(output, dict):
        return [np.asarray(output[name]) for name in sorted(output)]
    return [np.asarray(output)]


def _looks_reused(first: float, steady: float) -> bool:
    return first > REUSE_FACTOR * steady and first - steady > FRESH_INPUT_S


def _times(first: float, steady: float) -> float:
    """``first`` as a multiple of ``steady``; a cached call may time as 0 on a device."""
    return first / steady if steady > 0 else float("inf")


def _recheck(sampled: tuple[Any, ...], fresh: tuple[Any, ...],
             time_call: Callable[[tuple[Any, ...]], tuple[Any, float]]) -> tuple[float, float]:
    """The first call on ``fresh``, and the median of calls on ``sampled`` around it."""
    before = time_call(sampled)[1]
    first = time_call(fresh)[1]
    return first, statistics.median([before, time_call(sampled)[1], time_call(sampled)[1]])


def reused_result(runnable: Runnable, sampled: tuple[Any, ...],
                  new_set: Callable[[], tuple[Any, ...]],
                  time_call: Callable[[tuple[Any, ...]], tuple[Any, float]],
                  median: float) -> dict[str, Any]:
    """Refuse a result reused across samples: first calls on PROBES fresh sets from
    ``new_set`` (SLOW_FRESH_SETS from a median of SLOW_CALL_S) much slower than the
    ``median`` sample, and so again on each of RECHECKS further sets against calls on the
    ``sampled`` set timed beside them; or two fresh sets giving the identical output."""
    fresh_sets = [new_set() for _ in range(PROBES if median < SLOW_CALL_S
                                           else SLOW_FRESH_SETS)]
    firsts, outputs = [], []
    for args in fresh_sets:
        out, seconds = time_call(args)
        firsts.append(seconds)
        outputs.append(_arrays(runnable.fetch(out)))
    # The fastest first call: a memoised result makes every first call slow (it does
    # the work the samples skipped), while a load spike on a busy host slows only some.
    first = min(firsts)
    detail = (f"fastest first call on {len(firsts)} fresh input sets "
              f"{_times(first, median):.2f}× the median")
    rechecks = []
    if _looks_reused(first, median):
        for _ in range(RECHECKS):
            # Every set stays alive to the end, so none reuses the memory (the address,
            # the id) of an earlier one, and no cache keyed on that can hit.
            fresh_sets.append(new_set())
            rechecks.append(_recheck(sampled, fresh_sets[-1], time_call))
            if not _looks_reused(*rechecks[-1]):
                break
        else:
            again, steady = min(rechecks, key=lambda pair: _times(*pair))
            raise TimerFooled(
                f"a result is reused across samples: first calls on fresh inputs take "
                f"{first * 1e3:.3g} ms, {_times(first, median):.1f}× the "
                f"{median * 1e3:.3g} ms median, and on each of {RECHECKS} re-checks at least "
                f"{_times(again, steady):.1f}× calls on the sampled inputs beside them "
                f"({again * 1e3:.3g} ms against {steady * 1e3:.3g} ms)")
        again, steady = rechecks[-1]
        detail += (f", a stall: on re-check {len(rechecks)} a first call took "
                   f"{_times(again, steady):.2f}× calls on the sampled inputs beside it")
    if any(all(np.array_equal(a, b, equal_nan=True) for a, b in zip(outputs[0], other, strict=True))
           for other in outputs[1:]):
        raise TimerFooled("a result is reused across samples: different input sets gave "
                          "the identical output")
    return {"passed": True, "detail": detail + "; outputs differ", "rechecks": len(rechecks)}


def _skewed(seconds: Sequence[float], margin_s: float) -> tuple[bool, float, float]:
    mean, median = float(np.mean(seconds)), float(np.median(seconds))
    return mean > SKEW_FACTOR * median and mean - median > margin_s, mean, median


def work_per_call(seconds: Sequence[float], series: Callable[[int], list[float]],
                  on_host: bool) -> dict[str, Any]:
    """Refuse samples whose mean is SKEW_FACTOR times their median (and more than
    SKEW_HOST_S above it on the host clock, ABSOLUTE_S on a device's), where
    ``series(n)``, n further calls timed one by one, is skewed so on each of RECHECKS
    re-checks too."""
    margin = SKEW_HOST_S if on_host else ABSOLUTE_S
    skewed, mean, median = _skewed(seconds, margin)
    rechecks = 0
    while skewed and rechecks < RECHECKS:
        rechecks += 1
        time.sleep(min(max(10 * median, RECHECK_PAUSES[0]), RECHECK_PAUSES[1]))
        skewed, again, again_median = _skewed(series(len(seconds)), margin)
    if skewed:
        raise TimerFooled(
            f"the samples hide work in a few calls: their mean {mean * 1e3:.3g} ms is "
            f"{_times(mean, median):.1f}× their median {median * 1e3:.3g} ms, and so on each of "
            f"{RECHECKS} re-checks of {len(seconds)} calls (the last: {again * 1e3:.3g} ms "
            f"against {again_median * 1e3:.3g} ms)")
    return {"passed": True, "detail": f"mean {_times(mean, median):.2f}× the median"
                                      + (f", a stall: not so on re-check {rechecks}"
                                         if rechecks else ""), "rechecks": rechecks}


def timed_output(sample: int, got: Any, inputs: dict[str, np.ndarray],
                 check: Callable[[dict[str, np.ndarray], Any], str | None]) -> dict[str, Any]:
    """Refuse a measurement whose sample ``sample`` (drawn at random while sampling) gave
    an output (``got``, fetched after its wait) that ``check`` finds wrong on its
    ``inputs``; the oracle runs only now."""
    why = check(inputs, got)
    if why:
        raise TimerFooled(f"a timed call gave a wrong output: sample {sample}, drawn at "
                          f"random and checked against the oracle after sampling: {why}")
    return {"passed": True, "detail": f"sample {sample}'s output, drawn at random, "
                                      f"matches the oracle"}


def digests(args: tuple[Any, ...]) -> list[str | None]:
    """A hash of each argument the host can read as an array (None: one it cannot)."""
    return [hashlib.sha256(np.asarray(a).tobytes()).hexdigest()
            if hasattr(a, "__array__") else None for a in args]


def inputs_intact(sets: Sequence[tuple[tuple[Any, ...], list[str | None]]]
                  ) -> dict[str, Any]:
    """Refuse a call that changed its inputs: each sampled set's arguments against their
    ``digests`` when prepared."""
    for number, (args, before) in enumerate(sets):
        changed = [k for k, (was, now) in enumerate(zip(before, digests(args), strict=True))
                   if was != now]
        if changed:
            raise TimerFooled(f"the call changed its inputs: argument(s) {changed} of "
                              f"sampled input set {number} differ after sampling from what "
                              f"was prepared")
    readable = sum(d is not None for _, before in sets for d in before)
    return {"passed": True, "detail": f"{readable} host-readable argument(s) of "
                                      f"{len(sets)} sampled input set(s) unchanged"}


def untampered(replaced: Sequence[str]) -> dict[str, Any]:
    """Refuse a measurement during which the measured code replaced a function the
    measurement trusts (``tamper.Watch.replaced``)."""
    if replaced:
        raise TimerFooled(f"the measured code replaced what measures it: "
                          f"{', '.join(replaced)}")
    return {"passed": True, "detail": "the clocks, statistics and engine are the ones "
                                      "casebook imported"}
