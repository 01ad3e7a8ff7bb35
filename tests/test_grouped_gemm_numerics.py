"""Case 03 on any host: the grouped problem's checks, the inputs, and the numerics model
against the float64 oracle (fresh random inputs every run)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from casebook import config
from kernels import grouped_gemm_fp8_bf16 as case
from kernels.grouped_gemm_fp8_bf16 import numerics, problem

pytestmark = pytest.mark.timeout(120)
TOLERANCE = config.load_case("configs/cases", case.CASE)["tolerances"]["e5m2_bf16"]


def grouped(**changes) -> problem.GroupedProblem:
    fields = {"m": (16, 40, 0, 64), "n": 256, "k": 512, "chunk": 128, "mode": "scale_only",
              "alpha": 1.5, "beta": 0.5}
    return problem.GroupedProblem(**{**fields, **changes})


@pytest.mark.parametrize(("changes", "message"), [
    ({"m": ()}, "m: at least one group"),
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
    with pytest.raises(problem.ProblemError, match=message.replace("[", r"\[")
                       .replace("(", r"\(")):
        grouped(**changes)


def test_check_params_reports_the_reason_to_the_pipeline():
    params = {"m": [16], "n": 250, "k": 512, "chunk": 512, "mode": "scale_only",
              "dtype": "e5m2_bf16"}
    assert "n=250 must be a multiple of 16" in case.check_params(params)
    assert case.check_params({**params, "n": 256}) is None


def test_m_drawn_as_the_example_draws_it():
    m = problem.draw_m(1000, seed=5)
    assert set(m) <= {16 * i for i in range(1, 65)}
    assert len(set(m)) > 50  # the whole range is used
    assert problem.from_params({"m": {"groups": 4, "rows": 2048}, "n": 16, "k": 16,
                                "chunk": 16, "mode": "convert_only"}).m == (2048,) * 4


def test_inputs_follow_the_example_distributions_and_are_fresh():
    p = grouped(m=(256, 512), n=512)
    first = numerics.make_inputs(p, np.random.default_rng())
    second = numerics.make_inputs(p, np.random.default_rng())
    assert first["a"].dtype == ml_dtypes.bfloat16 and first["c"].dtype == np.float16
    assert first["b"].dtype == ml_dtypes.float8_e5m2
    for name, (low, high) in {"a": numerics.A_RANGE, "c": numerics.A_RANGE,
                              "b": numerics.B_RANGE, "scale": numerics.SCALE_RANGE}.items():
        values = first[name].astype(np.float64)
        assert low <= values.min() < low + 0.2 and high - 0.2 < values.max() <= high, name
        assert not np.array_equal(values, second[name].astype(np.float64)), name
    assert first["scale"].shape == (2, 512 // 128, 512)
    ones = numerics.make_inputs(grouped(mode="convert_only"), np.random.default_rng())
    assert (ones["scale"].astype(np.float32) == 1).all()  # as the example initialises them


def test_dequantize_rounds_the_scaled_product_to_bf16_per_chunk():
    p = grouped(m=(16,), n=16, k=256, chunk=128)
    inputs = numerics.make_inputs(p, np.random.default_rng())
    got = numerics.dequantize(p, inputs["b"], inputs["scale"])
    b = inputs["b"].astype(np.float64)
    scale = inputs["scale"].astype(np.float64)  # (1, 2, 16): chunk, n
    exact = b[0] * np.repeat(scale[0].T, 128, axis=1)
    assert np.array_equal(got[0], exact.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert (got[0] != exact).mean() > 0.3  # most products are inexact in bf16


@pytest.mark.parametrize("mode", ["convert_only", "scale_only"])
def test_the_model_agrees_with_the_oracle_within_the_derived_bound(mode):
    p = grouped(mode=mode, m=(16, 40, 0, 128, 64), k=1024)
    inputs = numerics.make_inputs(p, np.random.default_rng())
    want = numerics.oracle(p, inputs)
    result = numerics.compare(p, numerics.model(p, inputs), want, TOLERANCE)
    assert result["passed"], result
    assert result["nan_count"] == 0
    assert 0 < result["worst_error_over_tolerance"] <= 1
    assert result["example_rule_failures"] >= 0


def test_a_model_that_skips_the_bf16_rounding_is_caught():
    """Rounding the scaled operand to bf16 moves outputs by more than the bound allows: a
    model that multiplies B by its scale exactly fails at the example's default shape."""
    p = problem.from_params({"m": {"groups": 6, "seed": 2020}, "n": 2048, "k": 512,
                             "chunk": 512, "mode": "scale_only"})
    inputs = numerics.make_inputs(p, np.random.default_rng())
    scale = np.repeat(inputs["scale"].astype(np.float32), p.chunk, axis=1)[:, : p.k, :]
    exact = inputs["b"].astype(np.float32) * scale.transpose(0, 2, 1)
    a, offsets = inputs["a"].astype(np.float32), p.row_offsets
    unrounded = np.concatenate([(a[offsets[g]:offsets[g + 1]] @ exact[g].T).astype(np.float16)
                                for g in range(p.groups)])  # alpha 1, beta 0
    want = numerics.oracle(p, inputs)
    assert numerics.compare(p, numerics.model(p, inputs), want, TOLERANCE)["passed"]
    assert not numerics.compare(p, unrounded, want, TOLERANCE)["passed"]


def test_nan_and_shape_changes_never_pass():
    p = grouped()
    inputs = numerics.make_inputs(p, np.random.default_rng())
    got, want = numerics.model(p, inputs), numerics.oracle(p, inputs)
    got[3, 5] = np.nan
    assert not numerics.compare(p, got, want, TOLERANCE)["passed"]
    assert not numerics.compare(p, got[:-1], want, TOLERANCE)["passed"]


def test_the_example_rule_rejects_near_cancellation_that_the_bound_accepts():
    want = np.array([4e-5, 5.0, 0.0, 1e-3])
    got = np.array([4e-5 + 3e-6, 5.0 + 1e-3, 0.0, 1e-3 + 3e-5])
    # |ref| + |D| < 1e-4 demands an error below 1e-6; else 1% of |ref| + |D|.
    assert numerics.example_rule_failures(got, want) == 2
    p = grouped()
    assert numerics.compare(p, got, want, TOLERANCE)["passed"]


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
    problem_ = problem.from_params(params)
    inputs = change(numerics.make_inputs(problem_, rng))
    with pytest.raises(ValueError, match=message):
        if entry == "plugin":
            runnable = case.kernel("model", params, "check")
            runnable.call(*runnable.prepare(inputs))
        else:
            getattr(numerics, entry)(problem_, inputs)
