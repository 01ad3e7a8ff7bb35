"""Every element against the float32 reference on the device (kernels/splash_attention/
oracle_f32.py): its references and bounds are the float64 ones within float32's own
rounding; at sampled sizes the case's check applies it beside the sampled rows, so a fault
in rows no sample drew fails, and so does a NaN anywhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels.splash_attention as splash
from kernels.splash_attention import bounds, oracle_f32, upstream

pytestmark = pytest.mark.host_rehearsal  # jax.numpy on the CPU: both stacks

POINTS = {
    "causal_gqa": {"heads_q": 4, "heads_kv": 2, "seq_len": 256, "head_dim": 64,
                   "mask": {"kind": "causal"}},
    "local_packed_softcap": {"heads_q": 2, "heads_kv": 2, "seq_len": 256, "head_dim": 32,
                             "mask": {"kind": "local", "window": [50, 7]}, "segments": 3,
                             "soft_cap": 4.0},
    "mqa": {"heads_q": 3, "heads_kv": 1, "seq_len": 128, "head_dim": 16,
            "mask": {"kind": "causal"}},
}


def point(name, dtype="bfloat16"):
    return {**POINTS[name], "head_dim_v": POINTS[name]["head_dim"], "dtype": dtype}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("name", sorted(POINTS))
def test_the_device_pass_is_the_float64_bound_in_float32(name, dtype):
    params = point(name, dtype)
    inputs = splash.make_inputs(params, np.random.default_rng())
    found = {n: np.asarray(x, np.float64)
             for n, x in oracle_f32.references(params, inputs, gradients=True).items()}
    exact = {}
    for suffix, unit in (("bound", dtype), ("own_bound", "float32")):  # the reference's own
        at = {**params, "dtype": unit}
        exact["out"], exact[f"out_{suffix}"] = bounds.out_bound(at, inputs)
        for name, value in bounds.every_gradient_bound(at, inputs).items():
            exact[name.replace("_bound", f"_{suffix}")] = value
    for output in ("out", *splash.GRADIENTS):
        scale = np.abs(exact[output]).max()
        assert np.abs(found[output] - exact[output]).max() <= 1e-5 * scale, output
        for suffix in ("bound", "own_bound"):
            ratio = found[f"{output}_{suffix}"] / exact[f"{output}_{suffix}"]
            assert ratio.min() >= 1 - 1e-4 and ratio.max() <= 1 + 1e-4, (output, suffix)
    alone = oracle_f32.references(params, inputs, gradients=False)
    assert sorted(alone) == ["out", "out_bound", "out_own_bound"]
    np.testing.assert_allclose(np.asarray(alone["out_bound"]), found["out_bound"], rtol=1e-6)


def _upstream(params, inputs):
    """out, dq, dk, dv of upstream's kernels (Pallas's TPU interpreter on this host).
    Not jax.vjp of the dense baseline: its transposed dots round each query head's dk and
    dv to the dtype before the group's sum, which the bound does not model (it exceeds it
    by up to 1.6× at the last keys of a GQA point, where few queries see a key)."""
    q, k, v, do = (jnp.asarray(inputs[n]) for n in ("q", "k", "v", "do"))
    out = jax.jit(upstream.make(params, interpret=True))(q, k, v)
    grads = jax.jit(upstream.make_backward(params, interpret=True))(q, k, v, do)
    return {"out": np.asarray(out), **{n: np.asarray(grads[n]) for n in splash.GRADIENTS}}


def _tolerance(params):
    return {"atol": 0.0, "rtol": bounds.UNIT[params["dtype"]]}


@pytest.mark.parametrize("name", sorted(POINTS))
def test_a_sampled_check_holds_every_element_to_the_device_reference(name):
    params = point(name)
    inputs = splash.make_inputs(params, np.random.default_rng())
    got = _upstream(params, inputs)
    want = splash.sampled_oracle(params, inputs, int(np.random.default_rng().integers(2**62)),
                                 count=4)
    for output, value in got.items():
        found = splash.compare(params, inputs, output, value, want[output], _tolerance(params))
        every = found["every_element"]
        assert found["passed"] and every["passed"], (output, found)
        assert every["elements"] == value.size and every["elements_over"] == 0
        worst = (every["worst_error_over_tolerance"],
                 found["sampled"]["worst_error_over_tolerance"])
        assert min(worst) > 0 and max(worst) == found["worst_error_over_tolerance"]
        assert every["reference"].startswith("float32 reference on cpu")


@pytest.mark.parametrize("output", ["out", "dv"])
def test_a_fault_in_rows_no_sample_drew_fails_the_check(output):
    """One row off by a few of its bounds where the float64 sample did not look: the sampled
    part passes, every element's fails; a NaN there fails too."""
    params = point("causal_gqa")
    inputs = splash.make_inputs(params, np.random.default_rng())
    value = _upstream(params, inputs)[output]
    want = splash.sampled_oracle(params, inputs, int(np.random.default_rng().integers(2**62)),
                                 count=4)[output]
    drawn = set(zip(*(np.asarray(i).tolist() for i in want.index), strict=True))
    head, row = next((h, r) for h in range(value.shape[0]) for r in range(value.shape[1])
                     if (h, r) not in drawn and r > 8)
    reference, bound, own = (np.asarray(x) for x in want.whole())
    wrong = value.astype(np.float64)
    wrong[head, row] = reference[head, row] + 4 * (bound + own + np.abs(
        reference) * bounds.UNIT["bfloat16"])[head, row]
    found = splash.compare(params, inputs, output, wrong.astype(value.dtype), want,
                           _tolerance(params))
    assert found["sampled"] and not found["passed"]
    every = found["every_element"]
    assert not every["passed"] and 1 <= every["elements_over"] <= value.shape[2]
    nan = value.copy()
    nan[head, row, 0] = np.nan
    found = splash.compare(params, inputs, output, nan, want, _tolerance(params))
    assert not found["passed"] and found["every_element"]["nan_count"] == 1


def test_atol_and_rtol_alone_leave_the_device_reference_out():
    params = point("mqa")
    inputs = splash.make_inputs(params, np.random.default_rng())
    want = splash.sampled_oracle(params, inputs, 3, count=4)["out"]
    found = splash.compare(params, inputs, "out", _upstream(params, inputs)["out"],
                           want, {"atol": 3e-3, "rtol": 3e-3, "derived_bound": False})
    assert found["passed"] and "every_element" not in found


def test_a_chunk_divides_the_sequence_and_stays_within_its_budget():
    assert oracle_f32.chunk_rows(16, 32768) == 32
    assert oracle_f32.chunk_rows(1, 256) == 256
    assert oracle_f32.chunk_rows(4, 96) == 32
    for heads, n in ((16, 32768), (64, 65536), (3, 192)):
        rows = oracle_f32.chunk_rows(heads, n)
        assert n % rows == 0 and (rows * heads * n <= oracle_f32.CHUNK_ELEMENTS or rows == 1)


def test_sampled_rows_take_the_devices_bound_held_to_float64s_at_the_query_rows():
    """Key rows' float64 bound costs O(S²·d) a kv head: the device's is used (times SLACK,
    within it of float64's); at query rows float64's is computed and the device's held to
    it, so a device that evaluates the bound wrongly fails the check by name."""
    params = point("causal_gqa")
    inputs = splash.make_inputs(params, np.random.default_rng())
    got = _upstream(params, inputs)
    want = splash.sampled_oracle(params, inputs, int(np.random.default_rng().integers(2**62)),
                                 count=6)
    keys = (want["dk"].index[0], want["dk"].index[1])
    exact = bounds.gradient_bounds(params, inputs, (np.zeros(0, int), np.zeros(0, int)), keys)
    device = np.asarray(want["dk"].whole()[1], np.float64)[keys]
    ratio = device / exact["dk_bound"]
    assert ratio.min() > 1 / oracle_f32.SLACK and ratio.max() < oracle_f32.SLACK
    reference, bound, own = want["dq"].whole()
    want["dq"].whole = lambda: (reference, bound * 1.05, own)  # a device off by 5%
    found = splash.compare(params, inputs, "dq", got["dq"], want["dq"], _tolerance(params))
    assert not found["passed"] and "the device's float32 bound of dq" in found["error"]
    want["dq"].whole = lambda: (reference, bound, own)
    assert splash.compare(params, inputs, "dq", got["dq"], want["dq"],
                          _tolerance(params))["passed"]
