"""The TPU's device clock: traces captured on a TPU v5e (tests/data/tpu, by
benchmarks/tpu_probe.py, 2026-12-05) read on any host, and the clock's choice and refusals
where there is no TPU."""

from __future__ import annotations

import glob
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from casebook.measure import clocks, engine, tpu
from kernels.contract import Runnable

DATA = Path(__file__).parents[1] / "data" / "tpu"
# The probe's wall clock around block_until_ready, and the device's own splash kernel
# events (XLA Ops) read by hand from the same trace: what the module sums must agree with.
SPLASH_KERNEL_NS = [760578, 761609, 760991, 761255, 761807]


def test_a_matmul_trace_gives_one_program_per_call_to_the_picosecond():
    ran = tpu.read(str(DATA / "matmul1024_x3.xplane.pb"))
    assert [m.name for m in ran] == ["jit__lambda(3136205338606746991)"] * 3
    # device_duration_ps, not the rounded duration_ns
    assert [m.seconds for m in ran] == pytest.approx([19.0725e-6, 13.19375e-6, 13.3025e-6],
                                                     rel=1e-12)
    assert [m.start_ns for m in ran] == sorted(m.start_ns for m in ran)


def test_a_splash_programs_time_holds_its_kernel_and_little_else():
    """Each forward call: one program whose duration covers its Pallas kernel (the
    custom call) and an iota, within a microsecond."""
    ran = tpu.read(str(DATA / "splash4096_fwd_x5.xplane.pb"))
    assert len(ran) == 5
    for module, kernel_ns in zip(ran, SPLASH_KERNEL_NS, strict=True):
        assert kernel_ns * 1e-9 <= module.seconds <= kernel_ns * 1e-9 + 1e-6
    # 16 heads, causal S 4096, d 128: half of 4·H·S²·d FLOP, near half the bf16 peak
    fraction = 2 * 16 * 4096**2 * 128 / np.median([m.seconds for m in ran]) / 1.97e14
    assert 0.4 < fraction < 0.5


def test_a_trace_without_the_device_plane_names_the_planes_it_has(tmp_path):
    """A CPU host's own trace: no TPU plane, and the clock says so."""
    jax.profiler.start_trace(str(tmp_path))
    jax.block_until_ready(jax.jit(lambda a: a @ a)(jnp.ones((64, 64))))
    jax.profiler.stop_trace()
    [path] = glob.glob(f"{tmp_path}/**/*.xplane.pb", recursive=True)
    with pytest.raises(tpu.TpuUnavailable, match=r"no plane '/device:TPU:0' \(planes: \["):
        tpu.read(path)
    with pytest.raises(tpu.TpuUnavailable, match="no plane '/device:TPU:1'"):
        tpu.read(str(DATA / "matmul1024_x3.xplane.pb"), device=1)


def test_the_trace_clock_sums_the_programs_of_its_sample(monkeypatch):
    programs = [tpu.Module("jit_a(1)", 10.0, 2e-3), tpu.Module("jit_b(2)", 20.0, 5e-4)]
    monkeypatch.setattr(tpu, "read", lambda path, device: programs)
    out, timing = tpu.TraceClock().time(lambda: jnp.ones(3) * 2, jax.block_until_ready)
    assert (np.asarray(out) == 2).all()
    # the sample is the programs' time: no kernel sum beside it (that is CUPTI's, with
    # its launch overhead, which a trace does not give; the third window's baselines
    # failed on a summary that took one without the other)
    assert timing.seconds == pytest.approx(2.5e-3) and timing.kernel_s is None
    assert timing.kernels == 2 and timing.host_s > 0 and timing.unseen_s == 0


def test_a_sample_in_which_the_chip_ran_nothing_is_refused(monkeypatch):
    monkeypatch.setattr(tpu, "read", lambda path, device: [])
    with pytest.raises(tpu.TpuUnavailable, match="no program on the TPU"):
        tpu.TraceClock().time(lambda: 1, lambda out: None)


def test_the_device_work_of_a_block_is_its_programs_and_none_is_no_error(monkeypatch):
    """The early-return guard's reading: a block in which the chip ran nothing (a fetch
    of a finished output) is 0 s of device work, not a clock failure."""
    programs = [tpu.Module("jit_a(1)", 10.0, 2e-3), tpu.Module("jit_b(2)", 20.0, 5e-4)]
    monkeypatch.setattr(tpu, "read", lambda path, device: programs)
    assert tpu.TraceClock().device_seconds(lambda: 1) == pytest.approx(2.5e-3)
    monkeypatch.setattr(tpu, "read", lambda path, device: [])
    assert tpu.TraceClock().device_seconds(lambda: 1) == 0


def marker() -> tpu.Module:
    return tpu.Module(f"{tpu.MARKER}(9)", 0.0, 1e-6)


def test_one_trace_splits_into_its_samples_by_their_markers():
    a, b, c = (tpu.Module(f"jit_{n}(1)", 0.0, 1e-3) for n in "abc")
    assert tpu.split([marker(), a, marker(), marker(), b, c, marker()], 2) == [[a], [b, c]]
    with pytest.raises(tpu.TpuUnavailable, match="3 sample markers for 2 samples"):
        tpu.split([marker(), a, marker(), marker(), b, c], 2)


def test_samples_timed_in_one_trace_each_read_their_own_programs(monkeypatch):
    """The markers the clock runs are real programs; the trace it reads is a fake one,
    with a preparation's program (outside the markers) that no sample may count."""
    flush = tpu.Module("jit_flush(3)", 0.0, 7e-3)
    ran = [flush, marker(), tpu.Module("jit_a(1)", 0.0, 2e-3), marker(),
           flush, marker(), tpu.Module("jit_a(1)", 0.0, 3e-3),
           tpu.Module("jit_b(2)", 0.0, 5e-4), marker()]
    monkeypatch.setattr(tpu, "read", lambda path, device: ran)
    order = []
    timed = tpu.TraceClock().time_many(
        [(lambda k=k: order.append(f"before {k}"),
          lambda k=k: order.append(f"launch {k}") or jnp.ones(2) * k, jax.block_until_ready)
         for k in range(2)])
    assert order == ["before 0", "launch 0", "before 1", "launch 1"]
    assert [float(np.asarray(out)[0]) for out, _ in timed] == [0, 1]
    assert [t.seconds for _, t in timed] == pytest.approx([2e-3, 3.5e-3])
    assert [t.kernels for _, t in timed] == [1, 2] and all(t.host_s > 0 for _, t in timed)


def runnable(execution: dict) -> Runnable:
    return Runnable(prepare=lambda d: (), call=lambda: 1, sync=lambda out: None,
                    fetch=np.asarray, execution=execution)


def test_a_tpu_host_times_device_work_by_its_trace_and_host_work_by_the_host_clock():
    on_tpu = engine.Devices(None, "no GPU: test", tpu="TPU v5 lite")
    assert isinstance(on_tpu.clock("auto", runnable({})), tpu.TraceClock)
    assert isinstance(on_tpu.clock("tpu_trace", runnable({})), tpu.TraceClock)
    assert isinstance(on_tpu.clock("host", runnable({})), clocks.HostClock)
    assert isinstance(on_tpu.clock("auto", runnable({"interpret": True})), clocks.HostClock)
    with pytest.raises(tpu.TpuUnavailable, match="needs a TPU"):
        engine.Devices(None, "no GPU: test").clock("tpu_trace", runnable({}))


def test_this_cpu_host_has_no_tpu():
    with pytest.raises(tpu.TpuUnavailable, match="not a TPU"):
        tpu.find()
    assert engine.Devices.find().tpu is None
