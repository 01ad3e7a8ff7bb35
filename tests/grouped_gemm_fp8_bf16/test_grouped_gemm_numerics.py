"""Case 03 on any host: the grouped problem's checks, the inputs, and the numerics model
against the float64 oracle (fresh random inputs every run)."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from casebook.core import config
from kernels import grouped_gemm_fp8_bf16 as case
from kernels.grouped_gemm_fp8_bf16 import numerics, oracle_f64, problems

pytestmark = [pytest.mark.timeout(120), pytest.mark.host_rehearsal]
TOLERANCE = config.load_case("configs/cases", case.CASE)["tolerances"]["e5m2_bf16"]


def grouped(**changes) -> problems.GroupedProblem:
    fields = {"m": (16, 40, 0, 64), "n": 256, "k": 512, "chunk": 128, "mode": "scale_only",
              "alpha": 1.5, "beta": 0.5}
    return problems.GroupedProblem(**{**fields, **changes})


@pytest.mark.parametrize(("changes", "message"), [
    ({"m": ()}, "m=0 groups: at least one is needed"),
    ({"m": (16, -1)}, "m[1]=-1 must be a non-negative integer"),
    ({"n": 100}, "n=100 must be a multiple of 16"),
    ({"k": 72}, "k=72 must be a multiple of 16"),
    ({"k": 0}, "k=0 must be a positive integer"),
    ({"chunk": 0}, "chunk=0 must be a positive integer"),
    ({"mode": "zero_point"}, "mode='zero_point' must be one of"),
    ({"beta": float("nan")}, "beta=nan must be finite"),
], ids=["no_groups", "negative_m", "n_alignment", "k_alignment", "k_zero", "chunk_zero",
        "mode", "beta_nan"])
def test_a_bad_problem_is_rejected_naming_the_field(changes, message):
    with pytest.raises(problems.ProblemError, match=message.replace("[", r"\[")
                       .replace("(", r"\(")):
        grouped(**changes)


def test_check_params_reports_the_key_and_the_reason_to_the_pipeline():
    params = {"m": [16], "n": 250, "k": 512, "chunk": 512, "mode": "scale_only",
              "dtype": "e5m2_bf16"}
    assert case.check_params(params) == (
        "n", "250 must be a multiple of 16 (16-byte TMA alignment of fp8 rows)")
    assert case.check_params({**params, "m": [16, -1]})[0] == "m.1"
    assert case.check_params({**params, "n": 256}) is None


def test_m_drawn_as_the_example_draws_it():
    m = problems.draw_m(1000, seed=5)
    assert set(m) <= {16 * i for i in range(1, 65)}
    assert len(set(m)) > 50  # the whole range is used
    assert problems.from_params({"m": {"groups": 4, "rows": 2048}, "n": 16, "k": 16,
                                "chunk": 16, "mode": "convert_only"}).m == (2048,) * 4


def test_inputs_follow_the_example_distributions_and_are_fresh():
    p = grouped(m=(256, 512), n=512)
    first = problems.make_inputs(p, np.random.default_rng())
    second = problems.make_inputs(p, np.random.default_rng())
    assert first["a"].dtype == ml_dtypes.bfloat16 and first["c"].dtype == np.float16
    assert first["b"].dtype == ml_dtypes.float8_e5m2
    for name, (low, high) in {"a": problems.A_RANGE, "c": problems.A_RANGE,
                              "b": problems.B_RANGE, "scale": problems.SCALE_RANGE}.items():
        values = first[name].astype(np.float64)
        assert low <= values.min() < low + 0.2 and high - 0.2 < values.max() <= high, name
        assert not np.array_equal(values, second[name].astype(np.float64)), name
    assert first["scale"].shape == (2, 512 // 128, 512)
    ones = problems.make_inputs(grouped(mode="convert_only"), np.random.default_rng())
    assert (ones["scale"].astype(np.float32) == 1).all()  # as the example initialises them


def test_dequantize_rounds_the_scaled_product_to_bf16_per_chunk():
    p = grouped(m=(16,), n=16, k=256, chunk=128)
    inputs = problems.make_inputs(p, np.random.default_rng())
    got = problems.dequantize(p, inputs["b"], inputs["scale"])
    b = inputs["b"].astype(np.float64)
    scale = inputs["scale"].astype(np.float64)  # (1, 2, 16): chunk, n
    exact = b[0] * np.repeat(scale[0].T, 128, axis=1)
    assert np.array_equal(got[0], exact.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert (got[0] != exact).mean() > 0.3  # most products are inexact in bf16


@pytest.mark.parametrize("mode", ["convert_only", "scale_only"])
def test_the_model_agrees_with_the_oracle_within_the_derived_bound(mode):
    p = grouped(mode=mode, m=(16, 40, 0, 128, 64), k=1024)
    inputs = problems.make_inputs(p, np.random.default_rng())
    want = oracle_f64.oracle(p, inputs)
    result = numerics.compare(p, inputs, numerics.model(p, inputs), want, TOLERANCE)
    assert result["passed"], result
    assert result["nan_count"] == 0 and result["overflow_count"] == 0
    assert 0 < result["worst_error_over_tolerance"] <= 1
    assert 0 < result["atol_applied"]["min"] <= result["atol_applied"]["max"]
    assert result["example_rule_failures"] >= 0


def test_the_bound_is_per_element_from_the_actual_partial_sums():
    """An output whose products all vanish gets only the subnormal half step; one whose
    partial sums are large gets a bound that grows with them."""
    p = grouped(m=(16,), n=32, k=256, mode="convert_only", alpha=1.0, beta=0.0)
    inputs = problems.make_inputs(p, np.random.default_rng())
    inputs["a"][3] = 0
    bound = numerics.error_bound(p, inputs)
    assert np.all(bound[3] == numerics.F16_SUBNORMAL_STEP / 2)
    b = inputs["b"].astype(np.float64)[0]
    inputs["a"][5] = np.sign(b[7]).astype(ml_dtypes.bfloat16) * 4  # every product adds up
    grown = numerics.error_bound(p, inputs)
    total = 4 * np.abs(b[7]).sum()
    carried = np.cumsum(np.abs(b[7]) * 4)[15::16][:-1].sum() + total
    want = (carried * numerics.STEP_ERROR + numerics.U32 * total) * (1 + numerics.U16)
    assert grown[5, 7] == pytest.approx(want, rel=1e-4)


def _unrounded(p, inputs):
    """A model that multiplies B by its scale exactly (skips the bf16 rounding)."""
    return numerics.model(p, inputs, problems.dequantize(p, inputs["b"], inputs["scale"],
                                                         rounded=False))


MUTANT_POINTS = [
    {"m": {"groups": 6, "seed": 2020}, "n": 2048, "k": 512, "chunk": 512,
     "mode": "scale_only"},  # the example's defaults
    {"m": [48, 16], "n": 256, "k": 8192, "chunk": 512, "mode": "scale_only"},
    {"m": [32, 16], "n": 256, "k": 8192, "chunk": 8192, "mode": "scale_only", "alpha": 0.5,
     "beta": 0.5},
    {"m": [64], "n": 128, "k": 4096, "chunk": 128, "mode": "scale_only", "alpha": 2.0},
]


@pytest.mark.parametrize("params", MUTANT_POINTS, ids=["ex69", "k8192", "k8192_percol",
                                                        "k4096_alpha2"])
def test_the_bound_catches_near_miss_mutants_at_every_k(params):
    """Skipping the bf16 rounding of scale·B, or adding 0.1 to every output, fails at K up
    to 8192, where the inputs' supports gave a bound of 80."""
    p = problems.from_params(params)
    inputs = problems.make_inputs(p, np.random.default_rng())
    want = oracle_f64.oracle(p, inputs)
    model = numerics.model(p, inputs)
    assert numerics.compare(p, inputs, model, want, TOLERANCE)["passed"]
    biased = (model.astype(np.float32) + np.float32(0.1)).astype(np.float16)
    for mutant in (_unrounded(p, inputs), biased):
        found = numerics.compare(p, inputs, mutant, want, TOLERANCE)
        assert not found["passed"] and found["worst_error_over_tolerance"] > 1.5


def test_a_correct_f16_overflow_passes_and_a_wrong_one_does_not():
    p = grouped(m=(64, 64), n=128, k=512, alpha=2000.0, beta=0.0)
    inputs = problems.make_inputs(p, np.random.default_rng())
    want = oracle_f64.oracle(p, inputs)
    model = numerics.model(p, inputs)
    infs = np.isinf(model)
    assert infs.mean() > 0.3 and not np.isnan(model).any()
    assert np.array_equal(np.sign(model[infs]), np.sign(want[infs]))
    found = numerics.compare(p, inputs, model, want, TOLERANCE)
    assert found["passed"] and found["overflow_count"] == infs.sum(), found
    flipped = model.copy()
    flipped[np.argwhere(infs)[0][0], np.argwhere(infs)[0][1]] *= -1  # inf of the wrong sign
    assert not numerics.compare(p, inputs, flipped, want, TOLERANCE)["passed"]
    finite_wanted = model.copy()
    i, j = np.argwhere(np.abs(want) < 1000)[0]
    finite_wanted[i, j] = np.inf  # an overflow where the oracle is far inside the range
    assert numerics.compare(p, inputs, finite_wanted, want, TOLERANCE)["nan_count"] == 1
    clipped = model.copy()
    i, j = np.argwhere(np.abs(want) > 70000)[0]
    clipped[i, j] = np.float16(65504) * np.sign(want[i, j])  # finite where it must overflow
    assert not numerics.compare(p, inputs, clipped, want, TOLERANCE)["passed"]


def test_nan_and_shape_changes_never_pass():
    p = grouped()
    inputs = problems.make_inputs(p, np.random.default_rng())
    got, want = numerics.model(p, inputs), oracle_f64.oracle(p, inputs)
    got[3, 5] = np.nan
    assert not numerics.compare(p, inputs, got, want, TOLERANCE)["passed"]
    assert not numerics.compare(p, inputs, got[:-1], want, TOLERANCE)["passed"]


def test_the_example_rule_rejects_near_cancellation():
    want = np.array([4e-5, 5.0, 0.0, 1e-3])
    got = np.array([4e-5 + 3e-6, 5.0 + 1e-3, 0.0, 1e-3 + 3e-5])
    # |ref| + |D| < 1e-4 demands an error below 1e-6; else 1% of |ref| + |D|.
    assert numerics.example_rule_failures(got, want) == 2


@pytest.mark.parametrize(("change", "message"), [
    (lambda x: {**x, "a": x["a"].astype(np.float32)}, "a: dtype float32; needs bfloat16"),
    (lambda x: {**x, "b": x["b"].astype(ml_dtypes.float8_e4m3fn)},
     "b: dtype float8_e4m3fn; needs float8_e5m2"),
    (lambda x: {**x, "scale": np.concatenate([x["scale"]] * 2, axis=1)},
     r"scale: shape \(2, 4, 256\); needs \(2, 2, 256\)"),
    (lambda x: {**x, "scale": x["scale"][:, :1]}, r"scale: shape \(2, 1, 256\)"),
    (lambda x: {**x, "scale": x["scale"].transpose(0, 2, 1)},
     r"scale: shape \(2, 256, 2\); needs \(2, 2, 256\) \(groups, ceil\(K/c\), N\)"),
    (lambda x: {k: v for k, v in x.items() if k != "c"}, r"c: missing"),
])
@pytest.mark.parametrize("entry", ["model", "oracle", "plugin"])
def test_a_bad_input_is_named_not_broadcast(rng, change, message, entry):
    """Wrong dtypes and scale layouts, refused by name where they used to pass silently or
    end in a numpy broadcast error."""
    params = {"m": [16, 32], "n": 256, "k": 256, "chunk": 128, "mode": "scale_only"}
    problem_ = problems.from_params(params)
    inputs = change(problems.make_inputs(problem_, rng))
    with pytest.raises(ValueError, match=message):
        if entry == "plugin":
            runnable = case.kernel("model", params, "check")
            runnable.call(*runnable.prepare(inputs))
        else:
            {"model": numerics.model, "oracle": oracle_f64.oracle}[entry](problem_, inputs)


def _f32(exact: Fraction) -> np.float32:
    """``exact`` rounded to fp32, to nearest, ties to an even significand: of the fp32
    values around its float64 rounding, the nearest."""
    near = np.float32(float(exact))  # float() rounds once, to float64: within an fp32 ulp
    around = (np.nextafter(near, np.float32(-np.inf)), near,
              np.nextafter(near, np.float32(np.inf)))
    return min(around, key=lambda v: (abs(Fraction(float(v)) - exact),
                                      int(v.view(np.uint32)) & 1))


def _cutlass_epilogue_f32(acc, c, alpha, beta) -> np.ndarray:
    """Example 69's epilogue (Sm90LinearCombinationPtrArray) element by element in exact
    rationals: t = fp32(alpha · acc), then fp32(beta · C + t), one rounding each."""
    alpha, beta = Fraction(float(np.float32(alpha))), Fraction(float(np.float32(beta)))
    out = np.empty(acc.shape, np.float32)
    for index in np.ndindex(acc.shape):
        scaled = _f32(alpha * Fraction(float(acc[index])))
        out[index] = _f32(beta * Fraction(float(c[index])) + Fraction(float(scaled)))
    return out


def _old_order_f32(acc, c, alpha, beta) -> np.ndarray:
    """The port's epilogue before issue 47: fma(alpha, acc, fp32(beta · C)) (the fma by
    float64, which is exact here: alpha · acc has 48 bits and beta · C 35, within 53)."""
    source = np.float32(beta) * c.astype(np.float32)
    return (np.float64(np.float32(alpha)) * acc.astype(np.float64) + source).astype(np.float32)


def test_fma_f32_rounds_once_where_float64_rounds_twice():
    """(1 + 2⁻²³) · 1.5 is a tie between fp32 neighbours; -2⁻⁶⁰ makes the exact sum fall
    below it, but the float64 sum drops -2⁻⁶⁰ and the tie goes to even, up. Odd fp32 a
    times 1.5 is such a tie for any a, so half of these round wrongly through float64."""
    one = numerics.fma_f32(1 + 2.0**-23, 1.5, -(2.0**-60))
    assert one == np.float32(1.5 + 2.0**-23)
    assert np.float32(np.float64(1 + 2.0**-23) * 1.5 - 2.0**-60) == np.float32(1.5 + 2.0**-22)
    rng = np.random.default_rng()
    odd = rng.integers(2**22, 2**25 // 6, 400) * 2 + 1  # a in [1, 4/3): a · 1.5 below 2
    a = (odd * 2.0**-23 * 2.0 ** rng.integers(-20, 20, 400) * rng.choice([-1, 1], 400))
    a, b = a.astype(np.float32), np.full(400, 1.5, np.float32)
    c = (np.abs(a) * 2.0**-60 * rng.choice([-1, 1], 400)).astype(np.float32)
    # and plain draws over a wide range of exponents, the last 200 near cancellation
    wide = (rng.standard_normal((3, 600)) * 2.0 ** rng.integers(-30, 30, (3, 600)))
    wide = wide.astype(np.float32)
    wide[2, -200:] = -(wide[0, -200:].astype(np.float64) * wide[1, -200:]).astype(np.float32)
    a, b, c = (np.concatenate([tie, draw]) for tie, draw in zip((a, b, c), wide, strict=True))
    got = numerics.fma_f32(a, b, c)
    want = np.array([_f32(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r)))
                     for p, q, r in zip(a, b, c, strict=True)], np.float32)
    assert np.array_equal(got, want)
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert np.count_nonzero(naive[:400] != want[:400]) > 100


def test_the_epilogue_rounds_in_example_69s_order_at_inexact_alpha_and_beta():
    """At alpha 0.3, beta 0.7 (neither alpha · acc nor beta · C exact) the model's epilogue
    is fp32(beta · C + fp32(alpha · acc)), CUTLASS's order, element for element; the port's
    order before issue 47, fma(alpha, acc, fp32(beta · C)), differs in fp32 on about a
    quarter of the elements."""
    p = grouped(m=(16, 40), alpha=0.3, beta=0.7)
    inputs = problems.make_inputs(p, np.random.default_rng())
    acc = numerics.accumulate(p, inputs)
    want = _cutlass_epilogue_f32(acc, inputs["c"], p.alpha, p.beta)
    got = numerics.epilogue_f32(acc, inputs["c"], p.alpha, p.beta)
    assert np.array_equal(got, want)
    assert np.array_equal(numerics.model(p, inputs).view(np.uint16),
                          want.astype(np.float16).view(np.uint16))
    old = _old_order_f32(acc, inputs["c"], p.alpha, p.beta)
    assert np.mean(old != want) > 0.1


def test_the_old_epilogue_order_changes_d_itself():
    """The two orders, one fp32 ulp apart, round to different f16 where they straddle an
    f16 tie: 4 of 63,488 elements of D on this draw."""
    p = grouped(alpha=0.3, beta=0.7, m=(16, 40, 0, 128, 64))
    inputs = problems.make_inputs(p, np.random.default_rng(7))
    acc = numerics.accumulate(p, inputs)
    old = _old_order_f32(acc, inputs["c"], p.alpha, p.beta).astype(np.float16)
    assert np.count_nonzero(numerics.model(p, inputs) != old) > 0


@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 0.0), (0.5, 0.5), (2.0, 2.0)])
def test_the_orders_agree_where_alpha_and_beta_are_powers_of_two(alpha, beta):
    """alpha · acc and beta · C are then exact, so both orders are one rounding of the same
    value: the case's configurations (and the GPU records made before issue 47) hold."""
    p = grouped(alpha=alpha, beta=beta, m=(16, 40, 0, 128, 64))
    inputs = problems.make_inputs(p, np.random.default_rng())
    acc = numerics.accumulate(p, inputs)
    got = numerics.epilogue_f32(acc, inputs["c"], alpha, beta)
    assert np.array_equal(got, _old_order_f32(acc, inputs["c"], alpha, beta))


def test_at_beta_0_c_is_not_read():
    """As the example, which neither loads C nor keeps it at beta 0: a C of NaN and inf
    changes nothing, and a -0 product comes out +0 (fma(0, 0, -0))."""
    acc = np.array([[1.5, -0.0, -3.0]], np.float32)
    c = np.array([[np.nan, np.inf, 1.0]], np.float16)
    d = numerics.epilogue(acc, c, 2.0, 0.0)
    assert np.array_equal(d.view(np.uint16), np.array([[3.0, 0.0, -6.0]], np.float16).view(
        np.uint16))
