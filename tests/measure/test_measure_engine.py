"""The engine on CPU workloads, the guard fixtures it must catch, and the GPU paths
(CUDA events, CUPTI, NVML, L2 flush) driven through fakes of their libraries."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time

import fakes
import numpy as np
import pytest

from casebook.measure import cache, clocks, engine, gpu, guards, noise, tamper, throttle
from casebook.stages import timing
from kernels import contract
from kernels.contract import Runnable

pytestmark = [pytest.mark.timeout(120), pytest.mark.host_rehearsal]
QUICK = timing.default_settings(warmup_calls=2, criterion="fixed_count", count=15,
                                 repeats=1)
CPU = engine.Devices(None, "no GPU: test")
WORK_S = 0.003  # long enough to stand far above timer jitter on a busy machine


def inputs(rng):
    return {"x": rng.standard_normal(64)}


def honest() -> Runnable:
    def call(x):
        time.sleep(WORK_S)
        return x * 2

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=np.asarray, execution={})


def test_honest_work_is_measured_with_every_guard_passed():
    m = engine.measure(engine.Workload(honest(), inputs), QUICK, "hot", 1, CPU)
    assert len(m.kept) == 15 and m.stop_criterion == "fixed_count"
    assert min(m.kept) >= WORK_S
    assert all(g["passed"] for g in m.guards.values())
    assert m.clock_kind == "host" and not m.throttling["monitored"]
    summary = m.summary(0.95)
    assert summary["ci_low_s"] <= summary["median_s"] <= summary["ci_high_s"]


def test_warmup_calls_are_never_sampled():
    """The first two calls book a "compilation" of 50 ms, the rest WORK_S each (on a
    clock that reads what a call booked): no sample is a warm-up call."""
    calls = []

    def call(x):
        calls.append(None)
        fakes.BookedTime.last = 0.05 if len(calls) <= 2 else WORK_S
        return x * 2

    r = honest()._replace(call=call)
    m = engine.measure(engine.Workload(r, inputs), QUICK, "hot", 1, fakes.BOOKED)
    assert m.kept == [WORK_S] * 15


def test_cold_rotates_input_sets_past_the_last_level_cache():
    llc = 1 << 20
    state = cache.plan("cold", lambda i: (inputs(np.random.default_rng(i))["x"],),
                       set_bytes=8192, tools=None, stream=None, llc_bytes=lambda: llc)
    assert state.mode == "cold" and len(state.sets) == 2 * llc // 8192
    picks = [state.before_sample(i)[1] for i in range(len(state.sets) + 1)]
    assert picks[:3] == [0, 1, 2] and picks[-1] == 0
    assert "≥ 2×" in state.description


def test_a_cold_rotation_draws_a_few_sets_and_copies_them_into_memory_of_their_own(
        monkeypatch):
    """Past cache.FRESH_DRAWS a rotation set is a copy of an earlier draw: the same values
    in new memory (the cache is cold whatever the values); the oracle reads a copy of the
    set's source, which the runnable never holds; a guard's probe set is always a fresh
    draw."""
    monkeypatch.setattr(cache, "plan", functools.partial(cache.plan, llc_bytes=lambda: 1 << 20))
    draws = []

    def counted(rng):
        draws.append(None)
        return {"x": rng.standard_normal(1024)}

    subject = engine._subject(engine.Workload(honest(), counted), "cold", 3, CPU)
    sets = subject.state.sets
    assert len(sets) == 2 * (1 << 20) // 8192 > cache.FRESH_DRAWS
    assert len(draws) == cache.FRESH_DRAWS  # the first sizes a set, and is set 0
    assert np.array_equal(sets[0][0], counted(np.random.default_rng(3))["x"])
    draws.pop()
    assert f"({cache.FRESH_DRAWS} drawn, {len(sets) - cache.FRESH_DRAWS} copies" in (
        subject.state.description)
    fresh = [s[0] for s in sets[:cache.FRESH_DRAWS]]
    assert not any(np.array_equal(fresh[0], f) for f in fresh[1:])
    before = len(draws)
    for i in (0, cache.FRESH_DRAWS, len(sets) - 1):
        copy, source = sets[i][0], fresh[i % cache.FRESH_DRAWS]
        assert i < cache.FRESH_DRAWS or (
            np.array_equal(copy, source) and not np.shares_memory(copy, source))
        for_oracle = subject.inputs_of(sets[i])["x"]
        assert np.array_equal(for_oracle, copy) and not np.shares_memory(for_oracle, copy)
    assert len(draws) == before  # the oracle's inputs are kept, not drawn again
    probe = subject.prepare_set(-1)[0]
    assert len(draws) == before + 1
    assert not any(np.array_equal(probe, f) for f in fresh)


def test_a_set_drawn_by_the_caller_is_the_first_set_and_the_next_draws_follow_it():
    """time_baseline draws a set to check its baseline on; handed to the measurement of the
    same seed, it is set 0 and the sets after it are those the measurement would have
    drawn itself, one make_inputs call fewer; a set drawn from another seed is refused."""
    draws = []

    def counted(rng):
        draws.append(None)
        return {"x": rng.standard_normal(1024)}

    def rotation(workload):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cache, "plan", functools.partial(cache.plan, llc_bytes=lambda: 1 << 14))
            return engine._subject(workload, "cold", 7, CPU)

    own = rotation(engine.Workload(honest(), counted))
    drawn_by_itself = len(draws)
    rng = np.random.default_rng(7)
    first = counted(rng)
    draws.clear()
    given = rotation(engine.Workload(honest(), counted, drawn=engine.Drawn(7, first, rng)))
    assert len(draws) == drawn_by_itself - 1 >= 1
    assert len(own.state.sets) == len(given.state.sets) >= 2
    for mine, theirs in zip(own.state.sets, given.state.sets, strict=True):
        assert np.array_equal(mine[0], theirs[0])
    assert not np.shares_memory(given.state.sets[0][0], first["x"])  # the runnable's copy
    with pytest.raises(ValueError, match="seed 8 given to a measurement of seed 7"):
        rotation(engine.Workload(honest(), counted, drawn=engine.Drawn(
            8, first, np.random.default_rng(8))))


def test_a_runnable_that_writes_its_inputs_leaves_the_oracles_copy_alone():
    """The oracle's inputs are the set's source, never given to the runnable: a call that
    writes into its input buffer is caught by inputs_intact, and the output check reads
    the values the set was drawn with."""
    def call(x):
        time.sleep(WORK_S)
        x += 1.0
        return x * 2

    seen = []

    def check(host, out):
        seen.append(host["x"].copy())
        return None

    runnable = honest()._replace(call=call)
    with pytest.raises(guards.TimerFooled) as caught:
        engine.measure(engine.Workload(runnable, inputs, check), QUICK, "hot", 5, CPU)
    assert "inputs_intact" in caught.value.refusals
    assert len(seen) == 1 and np.array_equal(seen[0], inputs(np.random.default_rng(5))["x"])


def test_last_level_cache_is_read_from_sysfs(tmp_path):
    for index, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "32768K")]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{index}" / "size").write_text(f"{size}\n")
    assert cache.last_level_cache_bytes(tmp_path) == 32 * 2**20


# -- the three ways to fool a timer: fixtures the harness must catch ---------------------

def returns_early() -> Runnable:
    """The call hands its work to a thread and returns; the wait waits for nothing. The
    work is 10x WORK_S, as the side stream's: on a loaded host starting the thread (the
    whole timed call) took 2.4 ms, and a work of WORK_S then left a lag under the guard's
    margin (a quarter of the median)."""
    def call(x):
        result = {}
        worker = threading.Thread(
            target=lambda: (time.sleep(10 * WORK_S), result.update(y=x * 2)))
        worker.start()
        return worker, result

    def fetch(out):
        out[0].join()
        return out[1]["y"]

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=fetch, execution={})


def side_stream() -> Runnable:
    """The work runs on a side 'stream' the output's wait never sees; a device-wide
    barrier (all streams) still has to drain it. The work is 10x WORK_S: starting the
    thread is the whole timed call, and on a loaded host that can take milliseconds,
    which must stay under the guard's margin (a quarter of the median) of the drain."""
    streams: list[threading.Thread] = []
    buffer = np.zeros(64)

    def call(x):
        def work():
            time.sleep(10 * WORK_S)
            buffer[:] = x * 2
        streams.append(threading.Thread(target=work))
        streams[-1].start()
        return buffer

    def barrier():
        while streams:
            streams.pop().join()

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=lambda out: out.copy(), execution={}, barrier=barrier)


def cached_by_identity() -> Runnable:
    """The first call on a set of inputs works; later ones return the saved result."""
    saved = {}

    def call(x):
        if id(x) not in saved:
            time.sleep(WORK_S)
            saved[id(x)] = x * 2
        return saved[id(x)]

    return honest()._replace(call=call)


def cached_blindly() -> Runnable:
    """Computes once and returns that result for any input whatsoever."""
    saved = []

    def call(x):
        if not saved:
            saved.append(x * 2)
        time.sleep(WORK_S)
        return saved[0]

    return honest()._replace(call=call)


def refused_by(workload: engine.Workload, devices=CPU) -> dict[str, str]:
    """The guards that refused measuring ``workload``, each with its message: every guard
    runs, so which of them fires first (a matter of timing) decides nothing."""
    with pytest.raises(guards.TimerFooled) as refused:
        engine.measure(workload, QUICK, "hot", 1, devices)
    assert str(refused.value).startswith(next(iter(refused.value.refusals)))
    return refused.value.refusals


@pytest.mark.parametrize(("fixture", "guard", "message"), [
    (returns_early, "early_return", "returns before its work is done"),
    (side_stream, "unseen_stream", "stream the timer does not see"),
    (cached_by_identity, "reused_result", "reused across samples"),
    (cached_blindly, "reused_result", "identical output"),
], ids=["early-return", "side-stream", "cache-by-identity", "cache-blind"])
def test_the_harness_catches_a_timer_being_fooled(fixture, guard, message):
    """The guard meant for the cheat is among those that refuse it (others may too: a
    side stream's backlog also skews the samples, as work_per_call sees under load)."""
    refusals = refused_by(engine.Workload(fixture(), inputs))
    assert message in refusals.get(guard, ""), refusals


class ProgramClock(clocks.HostClock):
    """A fake device clock that reads the programs a fake chip ran (as the TPU trace
    does): a call's programs in its sample, its fetch's in ``device_seconds``."""

    kind = "tpu_trace"

    def __init__(self):
        self.ran: list[float] = []

    def time(self, launch, wait):
        before = len(self.ran)
        out = launch()
        wait(out)
        seconds = sum(self.ran[before:])
        return out, clocks.Timing(seconds=seconds, host_s=seconds)

    def device_seconds(self, block) -> float:
        before = len(self.ran)
        block()
        return sum(self.ran[before:])


@pytest.mark.parametrize("deferred", [0.0, WORK_S])
def test_on_a_clock_of_the_chips_programs_early_return_reads_the_programs(deferred):
    """The engine hands the early-return guard the clock's program reading: work left
    for the fetch is refused by it, and honest work whose fetch is slow passes."""
    clock = ProgramClock()

    class Chip(engine.Devices):
        def clock(self, wanted, runnable):
            return clock

    def call(x):
        clock.ran.append(WORK_S - deferred)
        return x * 2

    def fetch(out):
        clock.ran.append(deferred)
        time.sleep(WORK_S)  # a slow host transfer, no device work
        return out.copy()

    workload = engine.Workload(honest()._replace(call=call, fetch=fetch), inputs)
    chip = Chip(None, "no GPU: test", tpu="a fake chip")
    if deferred:
        assert "ran at least 3 ms more work" in refused_by(workload, chip)["early_return"]
        return
    m = engine.measure(workload, QUICK, "hot", 1, chip)
    assert "the clock's own programs" in m.guards["early_return"]["detail"]


class WindowClock(ProgramClock):
    """A fake clock that times several samples per window, as the TPU trace does."""

    samples_per_window = 4

    def __init__(self):
        super().__init__()
        self.windows: list[int] = []

    def time_many(self, samples):
        self.windows.append(len(samples))
        timed = []
        for before, launch, wait in samples:
            before()
            timed.append(self.time(launch, wait))
        return timed


def test_a_clock_with_windows_of_several_samples_takes_them_round_by_round():
    """Two interleaved workloads, cold (an input set per sample): each window holds four
    rounds of both, each sample on its own input set, booked with its round."""
    clock = WindowClock()

    class Chip(engine.Devices):
        def clock(self, wanted, runnable):
            return clock

    def call(x):
        clock.ran.append(float(abs(x).sum()) * 1e-6)
        return x * 2

    workloads = {name: engine.Workload(honest()._replace(call=call), inputs)
                 for name in ("a", "b")}
    found = engine.measure_interleaved(workloads, QUICK, "cold", 3,
                                       Chip(None, "no GPU: test", tpu="a fake chip"))
    assert clock.windows == [8] * 4  # 15 samples each: four windows of four rounds
    for m in found.values():
        assert [r["round"] for r in m.rows] == [r["sample"] for r in m.rows] == list(range(16))
        sets = [r["input_set"] for r in m.rows]
        assert len(set(sets)) == 16  # cold: every sample its own input set
        # ...and its own work: the first FRESH_DRAWS drawn, the rest copies doing theirs
        work = {r["input_set"]: r["seconds"] for r in m.rows}
        assert len(set(work.values())) == cache.FRESH_DRAWS
        assert all(work[i] == work[i % cache.FRESH_DRAWS] for i in work)
        assert m.guards["early_return"]["passed"]


def test_a_device_clock_without_launch_overheads_summarises_its_samples_alone():
    """A clock that gives a kernel sum but no launch overhead (a fake of the trace clock's
    first form) summarises its samples, with no kernel line beside them: the third TPU
    window's baselines failed here, on the median of the missing overheads."""
    class KernelSum(WindowClock):
        def time(self, launch, wait):
            out, timing = super().time(launch, wait)
            return out, dataclasses.replace(timing, kernel_s=timing.seconds)

    clock = KernelSum()

    class Chip(engine.Devices):
        def clock(self, wanted, runnable):
            return clock

    def call(x):
        clock.ran.append(WORK_S)
        return x * 2

    m = engine.measure(engine.Workload(honest()._replace(call=call), inputs), QUICK, "hot",
                       1, Chip(None, "no GPU: test", tpu="a fake chip"))
    summary = m.summary(0.95)
    assert summary["median_s"] == pytest.approx(WORK_S) and "kernel_median_s" not in summary


def test_settings_check_themselves():
    with pytest.raises(ValueError, match="warmup_calls"):
        dataclasses.replace(QUICK, warmup_calls=0)
    with pytest.raises(ValueError, match="criterion"):
        dataclasses.replace(QUICK, criterion="vibes")
    with pytest.raises(ValueError, match="min_samples"):
        dataclasses.replace(QUICK, min_samples=2)


def test_a_gpu_clock_on_a_cpu_host_is_refused_cleanly():
    devices = engine.Devices.find()  # this test host has no GPU (no driver)
    assert devices.tools is None and devices.no_gpu_reason.startswith("no GPU")
    with pytest.raises(gpu.GpuUnavailable, match="needs a GPU"):
        devices.clock("cupti_kernel", honest())


def test_a_a_rounds_interleave_and_give_a_floor():
    order = []

    def measure(seed):
        order.append(seed)
        return engine.measure(engine.Workload(honest(), inputs), QUICK, "hot", seed, CPU)

    result = noise.a_a(measure, rounds=4, quantile=0.5)
    assert order == list(range(8)) and len(result["ratios"]) == 4
    assert 0 <= result["noise_floor"] < 1


# -- GPU paths, through fakes of cuda-python, CUPTI and NVML ----------------------------

def gpu_runnable(device: fakes.Device, duration_ns=20_000, stream=1, late_ns=0) -> Runnable:
    def call(x):
        device.launch(duration_ns + int(abs(x[0]) * 10), stream=stream, late_ns=late_ns)
        return x * 2

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=np.asarray, execution={}, stream=1)


def test_cuda_events_time_the_runnables_stream_and_flush_l2_when_cold():
    device = fakes.Device()
    tools = fakes.tools(device, cupti=False)
    m = engine.measure(engine.Workload(gpu_runnable(device), inputs), QUICK, "cold", 1,
                       engine.Devices(tools))
    assert m.clock_kind == "cuda_event"
    assert all(20e-6 <= s < 21e-6 for s in m.kept)  # the booked durations, in seconds
    assert device.memsets and set(device.memsets) == {50 * 2**20}  # the L2's size
    # persisting lines released before every flush: no carve-out, none left persisting
    assert device.limits == {"cudaLimitPersistingL2CacheSize": 0}
    assert device.persisting_resets == len(device.memsets)
    assert "50 MiB memset" in m.cache_description and tools.cudart.freed == [0xBEEF]


def test_cuda_events_catch_work_on_a_stream_they_do_not_see():
    device = fakes.Device()
    tools = fakes.tools(device, cupti=False)

    def call(x):
        device.launch(20_000, stream=2)  # not the stream the events are recorded on
        device.pending_host_s = WORK_S  # so the device barrier has work left to drain
        return x * 2

    runnable = gpu_runnable(device)._replace(call=call)
    refusals = refused_by(engine.Workload(runnable, inputs), engine.Devices(tools))
    assert "stream the timer does not see" in refusals.get("unseen_stream", ""), refusals


@pytest.mark.parametrize("facts", [
    {"interpret": True, "device": "gpu"},  # an interpreter whose arrays live on the GPU
    {"device": "cpu", "subject": "numerics model"},  # numpy on the host: no launch at all
])
def test_host_work_on_a_gpu_host_is_timed_by_the_host_clock(facts):
    """A device clock would time only the launches the interpreter happens to make (or, for
    a host model, find no kernel and fail): host work takes the host clock, whatever the
    settings ask."""
    device = fakes.Device()
    tools = fakes.tools(device)

    def call(x):
        if facts.get("interpret"):
            device.launch(1_000)  # a small part of its work
        time.sleep(WORK_S)
        return x * 2

    runnable = Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                        fetch=np.asarray, execution=contract.execution("host work", **facts))
    for clock in ("auto", "cupti_kernel"):
        m = engine.measure(engine.Workload(runnable, inputs),
                           dataclasses.replace(QUICK, clock=clock), "hot", 1,
                           engine.Devices(tools))
        assert m.clock_kind == "host" and min(m.kept) >= WORK_S
    with pytest.raises(ValueError, match="mix host work and device kernels"):
        engine.measure_interleaved({"host": engine.Workload(runnable, inputs),
                                    "gpu": engine.Workload(gpu_runnable(device), inputs)},
                                   QUICK, "hot", 1, engine.Devices(tools))


def test_cupti_separates_kernel_time_from_launch_overhead():
    device = fakes.Device()
    tools = fakes.tools(device)
    m = engine.measure(engine.Workload(gpu_runnable(device), inputs), QUICK, "hot", 1,
                       engine.Devices(tools))
    assert m.clock_kind == "cupti_kernel"
    summary = m.summary(0.95)
    assert summary["kernel_median_s"] == pytest.approx(summary["median_s"])
    assert summary["launch_overhead_median_s"] == pytest.approx(fakes.LAUNCH_NS * 1e-9)
    assert tools.cupti.finalized


def test_cupti_sees_work_that_outlives_the_wait():
    device = fakes.Device()
    clock = clocks.CuptiKernelClock(fakes.tools(device))
    _, timing = clock.time(lambda: device.launch(20_000, late_ns=1_000_000), lambda out: None)
    assert timing.unseen_s == pytest.approx(1.02e-3)
    clock_on_stream = clocks.CuptiKernelClock(fakes.tools(device), stream_id=1)
    _, timing = clock_on_stream.time(lambda: device.launch(20_000, stream=7), lambda out: None)
    assert timing.unseen_s == pytest.approx(20e-6) and timing.kernels == 0


def test_throttled_samples_are_discarded_and_counted():
    device = fakes.Device()
    hot = fakes.Nvml.nvmlClocksEventReasonHwThermalSlowdown
    readings = [(0, 1980), (hot, 1980), (0, 1000), (fakes.Nvml.nvmlClocksEventReasonGpuIdle,
                                                     1980)]
    tools = fakes.tools(device, nvml=fakes.Nvml(readings))
    m = engine.measure(engine.Workload(gpu_runnable(device), inputs), QUICK, "hot", 1,
                       engine.Devices(tools))
    assert m.throttling == {"monitored": True, "discarded": 2,
                            "description": m.throttling["description"]}
    assert [r["discarded"] for r in m.rows[:4]] == [False, True, True, False]
    assert len(m.kept) == 15 and len(m.rows) == 17


def test_monitor_reads_reasons_and_clock():
    monitor = throttle.NvmlMonitor(gpu.Tools(None, fakes.Nvml([(0, 1400)]), None))
    reading = monitor.read()
    assert reading.throttled and reading.sm_clock_mhz == 1400  # below 75% of 1980


def test_repeats_are_separate_runs_of_the_criterion_with_a_run_to_run_interval():
    settings = timing.default_settings(warmup_calls=1, criterion="fixed_count", count=5,
                                       repeats=3)
    m = engine.measure(engine.Workload(honest(), inputs), settings, "hot", 4, CPU)
    assert [r["repeat"] for r in m.rows] == [0] * 5 + [1] * 5 + [2] * 5
    assert len(m.repeat_medians) == 3 and m.stop_reason.startswith("3 repeats")
    summary = m.summary(0.95)
    assert summary["interval"] == "run-to-run" and summary["repeats"] == 3
    assert summary["ci_low_s"] <= summary["median_s"] <= summary["ci_high_s"]
    with pytest.raises(ValueError, match="repeats"):
        dataclasses.replace(QUICK, repeats=0)


def test_repeats_share_the_timeout():
    settings = timing.default_settings(timeout_s=6.0, repeats=3)
    assert settings.criterion_unit().bounds.timeout_s == pytest.approx(2.0)


def doubling_check(inputs, got):
    """The oracle of ``honest``'s x * 2, as a Workload's check."""
    return None if np.allclose(got, inputs["x"] * 2) else "not x * 2"


def test_a_timed_output_is_checked_on_its_own_inputs_in_every_cache_state():
    """Honest work passes the check in hot and cold states: the kept sample's inputs are
    drawn again from its set's generator state (cold rotates many sets), and its output
    is fetched at once, before a later call reuses the runnable's one output buffer."""
    buffer = np.full(64, np.nan)

    def call(x):
        time.sleep(WORK_S)
        np.multiply(x, 2, out=buffer)
        return buffer

    r = honest()._replace(call=call, fetch=np.array)
    for mode in ("hot", "cold"):
        m = engine.measure(engine.Workload(r, inputs, doubling_check), QUICK, mode, 1, CPU)
        assert "matches the oracle" in m.guards["timed_output"]["detail"]


def test_a_call_wrong_only_when_timed_is_refused():
    """Right for warm-up and its first samples, then wrong: the sample drawn at random
    is checked."""
    calls = []

    def call(x):
        calls.append(None)
        time.sleep(WORK_S)
        return x * 2 if len(calls) <= 3 else x * 3

    r = honest()._replace(call=call)
    refusals = refused_by(engine.Workload(r, inputs, doubling_check))
    assert "a timed call gave a wrong" in refusals.get("timed_output", ""), refusals


def test_a_call_that_changes_its_inputs_is_refused():
    def call(x):
        time.sleep(WORK_S)
        x[0] += 1.0  # state kept in the input
        return x * 2

    refusals = refused_by(engine.Workload(honest()._replace(call=call), inputs))
    assert "the call changed its inputs: argument(s) [0]" in refusals.get("inputs_intact", ""), \
        refusals


def test_a_call_that_replaces_the_clock_is_refused():
    real = time.perf_counter_ns

    def call(x):
        time.perf_counter_ns = lambda: real() // 10
        time.sleep(WORK_S)
        return x * 2

    try:
        refusals = refused_by(engine.Workload(honest()._replace(call=call), inputs))
        assert "time.perf_counter_ns" in refusals.get("untampered", ""), refusals
    finally:
        time.perf_counter_ns = real
    assert engine.TRUSTED.replaced() == []


def test_a_gpu_library_replaced_before_it_was_noted_is_named():
    """The GPU libraries are noted when a measurement loads them: a timer replaced
    earlier shows as defined outside its library; the library's own do not."""
    tools = fakes.tools(fakes.Device(), cupti=False)
    assert engine.TRUSTED.with_tools(tools).replaced() == []
    tools.cudart.cudaEventElapsedTime = lambda start, stop: (0, 0.001)  # made here
    assert engine.TRUSTED.with_tools(tools).replaced() == ["fakes.cudaEventElapsedTime"]


def test_one_stall_is_not_work_hidden_in_a_few_calls():
    """One sample stalled 60× the work makes the mean several times the median (unless
    load slowed the others too); a re-check of as many calls clears it."""
    calls = []

    def call(x):
        calls.append(None)
        time.sleep(60 * WORK_S if len(calls) == 6 else WORK_S)
        return x * 2

    m = engine.measure(engine.Workload(honest()._replace(call=call), inputs), QUICK, "hot",
                       1, CPU)
    # How many re-checks it took depends on the host's load (the guard's own tests give
    # it samples, test_measure_guards.py); that it passed does not.
    assert m.guards["work_per_call"]["passed"]


def test_work_done_in_one_call_of_several_is_refused():
    """Every fourth call does four calls' work, the others none (batch-and-skip)."""
    calls = []

    def call(x):
        calls.append(None)
        if len(calls) % 4 == 0:
            time.sleep(4 * WORK_S)
        return x * 2

    refusals = refused_by(engine.Workload(honest()._replace(call=call), inputs))
    assert "the samples hide work" in refusals.get("work_per_call", ""), refusals


def test_the_real_gpu_libraries_are_not_taken_for_replaced_ones():
    """cuda-python's runtime (and CUPTI where installed) import without a driver: their
    timing functions, noted as a GPU measurement notes them, are their own."""
    from cuda.bindings import runtime as cudart

    tools = gpu.Tools(cudart=cudart, nvml=None, cupti=gpu.load_cupti())
    watch = engine.TRUSTED.with_tools(tools)
    assert watch.replaced() == []
    assert {name for (owner, name) in watch.loaded if owner is cudart} == set(tamper.CUDA)


def test_a_refusal_of_casebooks_own_workload_is_retried_a_stated_number_of_times():
    """The A/A matmul and the peaks are honest by construction: a guard refusing one is a
    stall of a loaded host, measured again (timing.OWN_WORKLOAD_RETRIES times at most)
    with every refusal kept for the record; one more refusal stands."""
    def refused(times: int):
        calls = []

        def measure(seed):
            calls.append(seed)
            if len(calls) <= times:
                raise guards.TimerFooled(f"stall {len(calls)}")
            return seed * 10
        return measure, calls

    retries = timing.OWN_WORKLOAD_RETRIES
    measure, calls = refused(retries)
    refusals: list[str] = []
    assert timing._retried(measure, refusals)(3) == 30
    assert calls == [3] * (retries + 1)
    assert refusals == [f"stall {i + 1}" for i in range(retries)]
    measure, _ = refused(retries + 1)
    with pytest.raises(guards.TimerFooled, match=f"stall {retries + 1}"):
        timing._retried(measure, [])(3)
