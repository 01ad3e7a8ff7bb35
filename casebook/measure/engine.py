"""The measuring loop: warm-up, then samples until the criterion stops, then the guards.

The loop only measures: the criterion decides when to stop (``stopping``), the cache
state picks each sample's inputs (``cache``), the clock times it (``clocks``), the
monitor says whether it was throttled (``throttle``). Summaries come from ``stats``.
Sampling runs ``repeats`` times, each repeat stopped by its own criterion, so that the
spread between repeats shows the drift that samples of one repeat cannot. Whether the
process ran on one CPU (``pinning``, done before jax starts) goes into the record.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from casebook.measure import (
    cache,
    clocks,
    gpu,
    guards,
    pinning,
    stats,
    stopping,
    tamper,
    throttle,
    tpu,
)
from kernels.contract import Runnable

CLOCKS = ("auto", "host", "cuda_event", "cupti_kernel", "tpu_trace")
CRITERIA = ("median_precision", "relative_noise", "fixed_count", "time_budget")
# Throttled samples discarded before the measurement gives up: a device that throttles
# this often cannot be measured at its rated clock.
MAX_DISCARDED = 100


@dataclasses.dataclass(frozen=True)
class Settings:
    """How to measure; built from the config's ``measurement`` block, checked here. Every
    field is given: the defaults live in the config schema alone
    (``timing.default_settings``)."""

    warmup_calls: int
    confidence: float
    clock: str
    criterion: str
    target: float  # median_precision: ±interval/median; relative_noise: stdev/mean
    min_samples: int
    min_time_s: float
    timeout_s: float
    count: int  # fixed_count
    budget_s: float  # time_budget
    repeats: int  # independent sampling runs; >= 2 gives a run-to-run interval

    def __post_init__(self):
        if self.warmup_calls < 1:
            raise ValueError(f"{self.warmup_calls=} must be at least 1 (compilation)")
        if self.repeats < 1:
            raise ValueError(f"{self.repeats=} must be at least 1")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"{self.confidence=} must lie in (0.5, 1)")
        if self.clock not in CLOCKS:
            raise ValueError(f"{self.clock=} must be one of {CLOCKS}")
        if self.criterion not in CRITERIA:
            raise ValueError(f"{self.criterion=} must be one of {CRITERIA}")
        self.criterion_unit()  # the criterion checks its own values

    def criterion_unit(self) -> stopping.Criterion:
        """One repeat's criterion: the timeout is shared among the repeats."""
        bounds = stopping.Bounds(self.min_samples, self.min_time_s,
                                 self.timeout_s / self.repeats)
        return {
            "median_precision": lambda: stopping.MedianPrecision(
                self.target, self.confidence, bounds),
            "relative_noise": lambda: stopping.RelativeNoise(self.target, bounds),
            "fixed_count": lambda: stopping.FixedCount(self.count),
            "time_budget": lambda: stopping.TimeBudget(self.budget_s),
        }[self.criterion]()


Check = Callable[[dict[str, np.ndarray], Any], "str | None"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A runnable, a way to make fresh host inputs for it, and ``check``: why a fetched
    output is wrong for its inputs, or None (the oracle; None: outputs are not checked)."""

    runnable: Runnable
    make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    check: Check | None = None
    drawn: Drawn | None = None  # the first set, already drawn by the caller


@dataclasses.dataclass(frozen=True)
class Drawn:
    """Host inputs a caller drew from ``np.random.default_rng(seed)`` (to check a call on
    them first), and that generator after the draw: a measurement with the same seed
    takes them as its first set and draws the next ones from ``rng``, as if it had drawn
    them itself (a draw can cost far more than a call: case 01 at the upstream sizes)."""

    seed: int
    inputs: dict[str, np.ndarray]
    rng: np.random.Generator


@dataclasses.dataclass
class Measurement:
    clock: str
    clock_kind: str
    clock_resolution_s: float
    warmup_calls: int
    stop_criterion: str
    stop_reason: str
    cache_mode: str
    cache_description: str
    pinned_cpu: int | None  # the CPU every thread ran on while sampling; None: not pinned
    throttling: dict[str, Any]
    guards: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]]  # every sample, discarded ones included
    wall_s: float
    binary_sha256: str | None = None  # what ran (``Runnable.binary``); None: not named

    @property
    def kept(self) -> list[float]:
        return [r["seconds"] for r in self.rows if not r["discarded"]]

    @property
    def kept_by_round(self) -> dict[int, float]:
        """Round -> the kept sample of that round (an interleaved measurement's pairs)."""
        return {r["round"]: r["seconds"] for r in self.rows if not r["discarded"]}

    @property
    def repeat_medians(self) -> list[float]:
        kept = [r for r in self.rows if not r["discarded"]]
        return [float(np.median([r["seconds"] for r in kept if r["repeat"] == i]))
                for i in sorted({r["repeat"] for r in kept})]

    def summary(self, confidence: float, floor: float | None = None) -> dict[str, Any]:
        """The record's measurement; ``floor``: the host's noise floor, where recorded."""
        kept = [r for r in self.rows if not r["discarded"]]
        extra = {}
        if kept and all(r["kernel_seconds"] is not None
                        and r["launch_overhead_seconds"] is not None for r in kept):
            extra = {"kernel_median_s": float(np.median([r["kernel_seconds"] for r in kept])),
                     "launch_overhead_median_s": float(np.median(
                         [r["launch_overhead_seconds"] for r in kept]))}
        return {
            "clock": self.clock, "clock_kind": self.clock_kind,
            "warmup_calls": self.warmup_calls,
            "stop_criterion": self.stop_criterion, "stop_reason": self.stop_reason,
            "cache": {"mode": self.cache_mode, "description": self.cache_description},
            "pinned_cpu": self.pinned_cpu,
            "throttling": self.throttling, "guards": self.guards, "wall_s": self.wall_s,
            "binary_sha256": self.binary_sha256,
            **stats.summarize(self.kept, confidence, self.repeat_medians, floor), **extra,
        }


@dataclasses.dataclass(frozen=True)
class Devices:
    """What this host measures with: GPU tools, or None and why there is no GPU; and the
    TPU its jax runs on (JAX's device kind), where it has one."""

    tools: gpu.Tools | None
    no_gpu_reason: str | None = None
    tpu: str | None = None

    @classmethod
    def find(cls) -> Devices:
        try:
            return cls(gpu.find())
        except gpu.GpuUnavailable as error:
            try:
                return cls(None, f"no GPU: {error}", tpu.find())
            except tpu.TpuUnavailable:
                return cls(None, f"no GPU: {error}")

    def clock(self, wanted: str, runnable: Runnable):
        """The clock ``wanted`` (auto: the finest this host has), but the host clock for a
        runnable whose work is host work (``clocks.times_on_host``), whatever was asked:
        on a GPU host the interpreter's device launches are a fraction of its time, and a
        numpy model launches none."""
        if clocks.times_on_host(runnable.execution):
            return clocks.HostClock()
        if wanted == "tpu_trace" and self.tpu is None:
            raise tpu.TpuUnavailable(f"clock 'tpu_trace' needs a TPU ({self.no_gpu_reason})")
        if self.tpu is not None and wanted in ("auto", "tpu_trace"):
            return tpu.TraceClock()
        if self.tools is None:
            if wanted not in ("auto", "host"):
                raise gpu.GpuUnavailable(f"clock {wanted!r} needs a GPU ({self.no_gpu_reason})")
            return clocks.HostClock()
        if wanted == "cupti_kernel" or (wanted == "auto" and self.tools.cupti is not None):
            return clocks.CuptiKernelClock(self.tools)
        if wanted == "cuda_event" or (wanted == "auto" and runnable.stream is not None):
            return clocks.CudaEventClock(self.tools, runnable.stream)
        return clocks.HostClock()

    def monitor(self):
        return throttle.NvmlMonitor(self.tools) if self.tools else throttle.Unmonitored()


def _row(index: int, repeat: int, which: int, timing: clocks.Timing,
         reading: throttle.Reading) -> dict[str, Any]:
    return {"sample": index, "repeat": repeat, "input_set": which, "seconds": timing.seconds,
            "host_seconds": timing.host_s, "kernel_seconds": timing.kernel_s,
            "launch_overhead_seconds": timing.launch_overhead_s, "kernels": timing.kernels,
            "unseen_seconds": timing.unseen_s, "sm_clock_mhz": reading.sm_clock_mhz,
            "clock_event_reasons": reading.reasons, "discarded": reading.throttled}


def measure(workload: Workload, settings: Settings, cache_mode: str, seed: int,
            devices: Devices) -> Measurement:
    """Warm up, sample ``settings.repeats`` times until the criterion stops each, check
    the guards."""
    return measure_interleaved({"subject": workload}, settings, cache_mode, seed,
                               devices)["subject"]


@dataclasses.dataclass
class _Prepared:
    """An input set as prepared: the host inputs it was prepared from (kept apart: the
    runnable is given a copy, so the oracle reads what the set held), and its arguments'
    ``guards.digests``."""

    source: dict[str, np.ndarray] | None  # None: a guard's probe set
    digests: list[str | None]


@dataclasses.dataclass
class _Subject:
    """One workload of an interleaved measurement: its inputs, samples and criterion, and
    the sample whose output is checked (drawn at random as sampling goes)."""

    workload: Workload
    state: Any
    prepare_set: Callable[[int], tuple[Any, ...]]
    prepared: dict[int, _Prepared]  # by id() of the live argument tuple
    picker: np.random.Generator
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    timings: list[clocks.Timing] = dataclasses.field(default_factory=list)
    criterion: Any = None
    index: int = 0
    sampled: dict[int, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    kept: tuple[int, tuple[Any, ...], Any] | None = None  # (sample, args, fetched output)

    @property
    def runnable(self) -> Runnable:
        return self.workload.runnable

    def inputs_of(self, args: tuple[Any, ...]) -> dict[str, np.ndarray]:
        """A copy of the host inputs ``args`` were prepared from."""
        return host_copy(self.prepared[id(args)].source)


def host_copy(host: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Host inputs in memory of their own (what a runnable is given of a kept set)."""
    return {name: np.array(value, copy=True) for name, value in host.items()}


def _subject(workload: Workload, cache_mode: str, seed: int, devices: Devices) -> _Subject:
    runnable = workload.runnable
    # The first set is drawn now (or was, by the caller): its size plans the cache state,
    # and it is the first set prepared.
    if workload.drawn is None:
        rng = np.random.default_rng(seed)
        first = [workload.make_inputs(rng)]
    elif workload.drawn.seed != seed:
        raise ValueError(f"inputs drawn from seed {workload.drawn.seed} given to a "
                         f"measurement of seed {seed}")
    else:
        rng, first = workload.drawn.rng, [workload.drawn.inputs]
    set_bytes = sum(a.nbytes for a in first[0].values())
    prepared: dict[int, _Prepared] = {}
    sources: list[dict[str, np.ndarray]] = []  # sets 0 .. FRESH_DRAWS - 1 as drawn

    def prepare_set(index: int) -> tuple[Any, ...]:
        kept = index >= 0  # a guard's probe set (index < 0) is never checked
        if kept and len(sources) == cache.FRESH_DRAWS:
            source = sources[index % cache.FRESH_DRAWS]
        else:
            source = first.pop() if first else workload.make_inputs(rng)
            if kept:
                sources.append(source)
        args = runnable.prepare(host_copy(source) if kept else source)
        runnable.sync(args)  # inputs resident before any call is timed on them
        prepared[id(args)] = _Prepared(source if kept else None, guards.digests(args))
        return args

    state = cache.plan(cache_mode, prepare_set, set_bytes, devices.tools, runnable.stream)
    return _Subject(workload, state, prepare_set, prepared,
                    np.random.default_rng([seed, 0x5A]))


def measure_interleaved(workloads: dict[str, Workload], settings: Settings, cache_mode: str,
                        seed: int, devices: Devices) -> dict[str, Measurement]:
    """Measure several workloads interleaved: every round takes one sample of each, in an
    order shuffled per round (seeded), until every workload's criterion has stopped, for
    ``settings.repeats`` repeats; then each one's guards.

    A host that drifts over seconds slows every workload of a round alike, so the ratio of
    two workloads' medians over the same rounds cancels the drift that separate
    measurements carry (``stats.compare_paired``). Rows carry their ``round``. Workload i
    draws its inputs from ``seed + i``. One clock times every workload (CUPTI has one
    subscriber per process); CUDA events are recorded on one stream, so under that clock
    the workloads must share it.
    """
    if not workloads:
        raise ValueError("an interleaved measurement needs at least one workload")
    names = list(workloads)
    on_host = {clocks.times_on_host(w.runnable.execution) for w in workloads.values()}
    if len(on_host) > 1:
        raise ValueError("interleaved workloads mix host work and device kernels: one clock "
                         "cannot time both kinds")
    clock = devices.clock(settings.clock, workloads[names[0]].runnable)
    if clock.kind == "cuda_event" and len({id(w.runnable.stream)
                                           for w in workloads.values()}) > 1:
        clock.close()
        raise guards.Unmeasurable("interleaved workloads run on different streams: CUDA "
                                  "events on one stream cannot time them all")
    order = np.random.default_rng([seed, len(names)])
    watch = TRUSTED.with_tools(devices.tools)
    monitor = devices.monitor()
    discarded, subjects = 0, {}
    try:
        for i, name in enumerate(names):
            subjects[name] = _subject(workloads[name], cache_mode, seed + i, devices)
        for s in subjects.values():
            for i in range(settings.warmup_calls):  # compilation, first-call costs
                args, _ = s.state.before_sample(i)
                s.runnable.sync(s.runnable.call(*args))
        start = time.perf_counter()
        round_ = 0
        # A clock whose window costs far more than a sample (a TPU trace: 0.3 s) takes
        # several rounds in one window; each sample is still timed apart.
        rounds_per_window = getattr(clock, "samples_per_window", 1)
        for repeat in range(settings.repeats):
            for s in subjects.values():
                s.criterion = settings.criterion_unit()
            began = time.perf_counter()
            while not all(s.criterion.finished for s in subjects.values()):
                plan = [(subjects[names[i]], round_ + k) for k in range(rounds_per_window)
                        for i in order.permutation(len(names))]
                discarded += _samples(plan, clock, monitor, repeat, began)
                if discarded > MAX_DISCARDED:
                    raise guards.Unmeasurable(
                        f"{discarded} throttled samples discarded: the device does "
                        f"not hold its clock")
                round_ += rounds_per_window
        wall = time.perf_counter() - start
        checks = {name: _guards(s, clock, watch) for name, s in subjects.items()}
        binaries = {name: _binary(s) for name, s in subjects.items()}
    finally:
        for s in subjects.values():
            s.state.close()
        clock.close()
    out = {}
    for name, s in subjects.items():
        criterion = s.criterion
        reason = criterion.reason if settings.repeats == 1 else (
            f"{settings.repeats} repeats, each stopped by it; the last: {criterion.reason}")
        if len(names) > 1:
            reason += (f"; interleaved with {len(names) - 1} other workload(s), "
                       f"{round_} rounds, until every one's criterion stopped")
        out[name] = Measurement(
            clock=clock.description, clock_kind=clock.kind,
            clock_resolution_s=clock.resolution_s, warmup_calls=settings.warmup_calls,
            stop_criterion=criterion.name,
            stop_reason=reason, cache_mode=s.state.mode,
            cache_description=s.state.description, pinned_cpu=pinning.pinned_cpu(),
            throttling={"monitored": monitor.monitored, "description": monitor.description,
                        "discarded": sum(r["discarded"] for r in s.rows)},
            guards=checks[name], rows=s.rows, wall_s=wall, binary_sha256=binaries[name])
        _report(name, out[name])
    return out


def _report(name: str, m: Measurement) -> None:
    """One line per workload on stderr (the job's log): a measurement stopped by its
    job's budget has said how far it got."""
    kept = m.kept
    median = f"{np.median(kept) * 1e6:.2f} µs" if kept else "none"
    sys.stderr.write(f"measured {name}: {len(kept)} kept, "
                     f"{m.throttling['discarded']} discarded (throttled), median {median}, "
                     f"{m.wall_s:.2f} s, clock {m.clock_kind}; {m.stop_reason}\n")


def _samples(plan: list[tuple[_Subject, int]], clock, monitor, repeat: int,
             began: float) -> int:
    """One sample of each subject of ``plan`` (subject, round), in its order, in one window
    of the clock where it takes several (``time_many``); how many were throttled
    (discarded). A subject whose criterion has stopped goes on sampling, so that every
    round holds every subject. Outputs of one window are fetched after it: jax arrays (the
    TPU's), which no later call can overwrite."""
    if not hasattr(clock, "time_many"):
        return sum(_record(s, *_one_sample(s, clock), monitor, repeat, round_, began)
                   for s, round_ in plan)
    inputs: list[tuple[tuple[Any, ...], int]] = []
    indices = [s.index + sum(t is s for t, _ in plan[:j]) for j, (s, _) in enumerate(plan)]

    def prepare(j: int) -> Callable[[], None]:
        return lambda: inputs.append(plan[j][0].state.before_sample(indices[j]))

    def launch(j: int) -> Callable[[], Any]:
        return lambda: plan[j][0].runnable.call(*inputs[j][0])

    timed = clock.time_many([(prepare(j), launch(j), s.runnable.sync)
                             for j, (s, _) in enumerate(plan)])
    return sum(_record(s, *inputs[j], *timed[j], monitor, repeat, round_, began)
               for j, (s, round_) in enumerate(plan))


def _one_sample(s: _Subject, clock) -> tuple[tuple[Any, ...], int, Any, clocks.Timing]:
    args, which = s.state.before_sample(s.index)
    out, timing = clock.time(lambda: s.runnable.call(*args), s.runnable.sync)
    return args, which, out, timing


def _record(s: _Subject, args: tuple[Any, ...], which: int, out: Any,
            timing: clocks.Timing, monitor, repeat: int, round_: int, began: float) -> int:
    """Book one sample of ``s``; 1 when it was throttled (discarded), else 0."""
    reading = monitor.read()
    s.rows.append({**_row(s.index, repeat, which, timing, reading), "round": round_})
    s.sampled[id(args)] = args
    # Reservoir sampling: every sample so far is the kept one with equal chance, so the
    # runnable cannot know which output will be checked. Fetched now (a few times in a
    # measurement: sample i replaces the kept one with chance 1/(i+1)), before a later
    # call can reuse its buffer.
    if s.picker.random() * (s.index + 1) < 1:
        s.kept = (s.index, args, s.runnable.fetch(out))
    s.index += 1
    if reading.throttled:
        time.sleep(monitor.pause_s)
        return 1
    s.timings.append(timing)
    if not s.criterion.finished:
        s.criterion.add(timing.seconds, time.perf_counter() - began)
    return 0


def _guards(s: _Subject, clock, watch: tamper.Watch) -> dict[str, dict[str, Any]]:
    """Every guard on ``s``, by name: those that call the runnable again last, so that
    the output checked and the inputs hashed are the samples' own. Every guard runs, even
    after one has refused: a cheat is refused with the name and message of each guard that
    caught it (``guards.TimerFooled.refusals``), so which one fires first, a matter of
    timing, decides nothing."""
    seconds = [t.seconds for t in s.timings]
    median = float(np.median(seconds))
    args, _ = s.state.before_sample(0)
    time_call = _first_call(clock, s.runnable)
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "untampered": lambda: guards.untampered(watch.replaced())}
    if s.workload.check is not None and s.kept is not None:
        sample, kept_args, got = s.kept
        checks["timed_output"] = lambda: guards.timed_output(
            sample, got, s.inputs_of(kept_args), s.workload.check)
    checks.update({
        "inputs_intact": lambda: guards.inputs_intact(
            [(a, s.prepared[key].digests) for key, a in s.sampled.items()]),
        "work_per_call": lambda: guards.work_per_call(
            seconds, lambda n: [time_call(args)[1] for _ in range(n)], clock.kind == "host"),
        "early_return": lambda: guards.early_return(
            s.runnable, args, median, getattr(clock, "device_seconds", None)),
        "unseen_stream": lambda: guards.unseen_work(
            s.runnable, args, s.timings, median,
            lambda n: [clock.time(lambda: s.runnable.call(*args), s.runnable.sync)[1]
                       for _ in range(n)]),
        "reused_result": lambda: guards.reused_result(
            s.runnable, args, lambda: s.prepare_set(-1), time_call, median),
    })
    passed: dict[str, dict[str, Any]] = {}
    refusals: dict[str, str] = {}
    # untampered runs again last: the guards' own calls may have replaced something too
    for name, guard in [*checks.items(), ("untampered", checks["untampered"])]:
        try:
            passed[name] = guard()
        except guards.TimerFooled as error:
            refusals[name] = str(error)
    if refusals:
        raise guards.TimerFooled.by(refusals)
    return passed


def _binary(s: _Subject) -> str | None:
    """The runnable's name for what ran on the sampled inputs (``Runnable.binary``)."""
    if s.runnable.binary is None:
        return None
    return s.runnable.binary(s.state.before_sample(0)[0])


def _first_call(clock, runnable: Runnable):
    """Times one call on a set of arguments (its first, or a repeat), with the measuring
    clock."""
    def time_call(args: tuple[Any, ...]) -> tuple[Any, float]:
        out, timing = clock.time(lambda: runnable.call(*args), runnable.sync)
        return out, timing.seconds
    return time_call


# What a measurement trusts, noted now: this module is imported before any case's code.
TRUSTED = tamper.Watch()
