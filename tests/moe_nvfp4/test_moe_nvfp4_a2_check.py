"""Case 01's per-stage a2 check: act follows stage 1's output (the model's a1 for the
stage variant, the kernel's own for a whole path) and is known to GEMM1's f32
accumulation carried through SiLU·mul by SiLU's derivative over gate's interval
(``oracle_f64.silu_slope``). Each term is shown to matter: a code may round either way
only where that error reaches a tie, and a whole path's a2 is judged by its own a1."""

from __future__ import annotations

import numpy as np
import pytest

from casebook.core import cases, config, paths
from kernels.moe_nvfp4 import checks, numerics, oracle_f64, oracle_planes

moe = cases.load("moe_nvfp4")
SPEC = config.load_case(paths.SOURCE_ROOT / "configs/cases", "moe_nvfp4")
POINTS = [p["params"] for p in SPEC["points"]]
TOLERANCE = config.tolerance(SPEC, "nvfp4", "a2", "moe_nvfp4.yaml")


def silu_derivative(x):
    sigmoid = 1 / (1 + np.exp(-x))
    return sigmoid * (1 + x * (1 - sigmoid))


def test_silu_slope_bounds_the_derivative_over_the_interval(rng):
    gate = rng.uniform(-12, 12, 2000)
    error = 10 ** rng.uniform(-8, 0.5, 2000)
    slope = oracle_f64.silu_slope(gate, error)
    inside = gate[:, None] + error[:, None] * np.linspace(-1, 1, 257)[None, :]
    assert np.all(np.abs(silu_derivative(inside)).max(-1) <= slope * (1 + 1e-12))
    assert np.all(slope <= oracle_f64.SILU_SLOPE_MAX)
    # Local: a narrow interval is bounded by the derivative at its centre, not globally
    # (|SiLU''| <= 1/2, so 1e-9 either side moves it by at most 5e-10).
    narrow = oracle_f64.silu_slope(gate, np.full_like(gate, 1e-9))
    np.testing.assert_allclose(narrow, np.abs(silu_derivative(gate)), rtol=0, atol=1e-9)


def test_silu_slope_takes_the_extreme_an_interval_holds():
    extreme = 2.3994  # SiLU' peaks near here (1.0998); the bound must cover the peak
    for gate, error in ((extreme - 0.5, 1.0), (-extreme + 0.2, 0.5), (-10.0, 20.0)):
        assert (
            oracle_f64.silu_slope(np.array([gate]), np.array([error]))[0]
            >= np.abs(silu_derivative(np.linspace(gate - error, gate + error, 10001))).max()
        )


def _stage(tie_offset: float):
    """One expert's a1 (ones) and W1 putting act[0] = SiLU(-6)·u0 and act[15] =
    SiLU(-6)·6 (the block's amax), all else 0; gs places act[0]·gs/sf at
    5·(1 + tie_offset), 5 being the tie of e2m1 4 and 6, with the block's scale 1."""
    k, n = 16, 16
    w = np.zeros((1, 2 * n, k))
    w[0, [0, 15], 0] = -6.0  # gates
    w[0, n, 0], w[0, n + 15, 0] = 5.0, 6.0  # ups
    packed, scales = numerics.quantize(w, np.ones(1))
    inputs = {"w1_packed": packed, "w1_scales": scales, "alpha1": np.ones(1, np.float32)}
    act = oracle_f64.silu_mul(
        np.einsum("emk,enk->emn", np.ones((1, 1, k)), numerics.dequantize(packed, scales))
    )
    inputs["a2_gs"] = np.array([5 * (1 + tie_offset) / abs(act[0, 0, 0])])
    assert numerics.round_e4m3(numerics.block_scale(act, inputs["a2_gs"]))[0, 0, 0] == 1
    return inputs, act


@pytest.mark.parametrize("tie_offset", [3e-6, 1e-4])
def test_an_a2_code_rounds_either_way_only_where_act_error_reaches_the_tie(tie_offset):
    """act[0] sits 3e-6 or 1e-4 (relative) above a tie: beyond the requantize's own
    2^-21 window, inside or outside GEMM1's f32 error (34·2^-24 of |gate| = 6) through
    SiLU'(-6) ≈ -0.012; with SiLU's global |SiLU'| <= 1.1 both would be inside."""
    inputs, act = _stage(tie_offset)
    valid = np.ones((1, 1), bool)
    planes = oracle_planes.a2_planes(np.ones((1, 1, 16)), inputs, valid)
    nearest = checks.kernel_planes(*numerics.quantize(act, inputs["a2_gs"]))
    assert nearest[0, 0, 0, 0] == -6
    other = nearest.copy()
    other[0, 0, 0, 0] = -4
    assert checks.codes(nearest, planes, numerics.TIE_WINDOW)["passed"]
    either_way = tie_offset < 1e-5
    assert checks.codes(other, planes, numerics.TIE_WINDOW)["passed"] == either_way
    # The f32 error alone is what decides it: no slack, no code may round either way.
    exact = oracle_planes.code_planes(act, inputs["a2_gs"], valid, np.zeros_like(act))
    assert not checks.codes(other, exact, numerics.TIE_WINDOW)["passed"]


def _judged(params, inputs, want, a2, **outputs):
    return moe.compare(params, inputs, "a2", a2, want["a2"], TOLERANCE, False, outputs)


def test_a_whole_paths_a2_is_checked_through_its_own_a1(rng):
    """A kernel whose quantize took another a1 code writes a2 of that a1: it passes
    against its own a1 and fails against the model's; a non-finite a1 on a computed row
    fails a2."""
    params = POINTS[0]
    inputs = moe.make_inputs(params, rng)
    want = moe.oracle(params, inputs)
    a1 = moe.model_outputs(params, inputs, want)["a1"]
    valid = oracle_f64.valid_rows(inputs["masked_m"], a1.shape[2])
    e, m = np.argwhere(valid)[0]
    k = int(np.argmax(np.abs(a1[0, e, m] * a1[1, e, m])))  # the row's largest element
    a1[0, e, m, k] = np.copysign(4.0, a1[0, e, m, k])  # its code 6 -> 4, the next down
    h = np.einsum(
        "emk,enk->emn",
        np.where(valid[..., None], a1[0] * a1[1], 0.0),
        numerics.dequantize(inputs["w1_packed"], inputs["w1_scales"]),
    )
    act = oracle_f64.silu_mul(h * inputs["alpha1"].astype(np.float64)[:, None, None])
    a2 = checks.kernel_planes(*numerics.quantize(act, inputs["a2_gs"]))
    assert not np.array_equal(
        a2[:, valid], checks.kernel_planes(inputs["a2_packed"], inputs["a2_scales"])[:, valid]
    )
    assert _judged(params, inputs, want, a2, a1=a1)["passed"]
    assert not _judged(params, inputs, want, a2)["passed"]
    a1[0, e, m, k] = np.nan
    found = _judged(params, inputs, want, a2, a1=a1)
    assert not found["passed"] and "not finite" in found["error"]
