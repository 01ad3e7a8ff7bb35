"""Inputs, the float64 oracle, the numerics model and its error bound (numpy only).

The kernel's arithmetic, as CUTLASS example 69 does it: B (fp8 e5m2) is converted to bf16
and, in ScaleOnly mode, multiplied by its scale in bf16 arithmetic, i.e. the dequantized
operand is bf16(float(B) · float(scale)) rounded to nearest even (the product of a 3-bit
and an 8-bit significand is exact in fp32, so this is a single rounding); the GEMM
accumulates in fp32; the epilogue computes fma(alpha, acc, beta · C) in fp32 and rounds to
f16.
The oracle evaluates the same problem in float64 on the same dequantized operand, so the
model's error against it is fp32 accumulation plus the final f16 rounding only.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from kernels.grouped_gemm_fp8_bf16.problem import GroupedProblem

# The example's input distributions (initialize_tensor / initialize_scale): uniform, then
# rounded to the element type.
A_RANGE = (-5.0, 5.0)  # 16-bit operands: A (bf16) and C (f16)
B_RANGE = (-2.0, 2.0)  # 8-bit operand B
SCALE_RANGE = (0.1, 2.0)
U16 = 2.0**-11  # unit roundoff of f16 (10 fraction bits)
U32 = 2.0**-24
F16_SUBNORMAL_STEP = 2.0**-24  # spacing of f16 subnormals; half of it bounds their rounding
# The example's own check: cutlass::relatively_equal in f16 with these constants.
EXAMPLE_EPSILON, EXAMPLE_FLOOR = 1e-2, 1e-4


def _uniform(rng: np.random.Generator, bounds: tuple[float, float], shape, dtype) -> np.ndarray:
    return rng.uniform(*bounds, size=shape).astype(np.float32).astype(dtype)


def make_inputs(problem: GroupedProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh A, B, scales and C; groups stacked along M (A, C), or leading (B, scales).

    In ConvertOnly mode the scales are all ones, as the example initialises them.
    """
    rows, n, k = sum(problem.m), problem.n, problem.k
    scale_shape = (problem.groups, problem.scale_k, n)  # N contiguous, as the example stores it
    if problem.mode == "scale_only":
        scale = _uniform(rng, SCALE_RANGE, scale_shape, ml_dtypes.bfloat16)
    else:
        scale = np.ones(scale_shape, ml_dtypes.bfloat16)
    return {
        "a": _uniform(rng, A_RANGE, (rows, k), ml_dtypes.bfloat16),
        "b": _uniform(rng, B_RANGE, (problem.groups, n, k), ml_dtypes.float8_e5m2),
        "scale": scale,
        "c": _uniform(rng, A_RANGE, (rows, n), np.float16),
    }


def expected_inputs(problem: GroupedProblem) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Each input's (shape, dtype) as ``make_inputs`` lays them out."""
    rows = sum(problem.m)
    return {"a": ((rows, problem.k), ml_dtypes.bfloat16),
            "b": ((problem.groups, problem.n, problem.k), ml_dtypes.float8_e5m2),
            "scale": ((problem.groups, problem.scale_k, problem.n), ml_dtypes.bfloat16),
            "c": ((rows, problem.n), np.float16)}


def check_inputs(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> None:
    """A ValueError naming the input, what it got and what it needs (shape, dtype)."""
    for name, (shape, dtype) in expected_inputs(problem).items():
        if name not in inputs:
            raise ValueError(f"{name}: missing; needs {shape} {np.dtype(dtype).name}")
        got = inputs[name]
        if np.dtype(got.dtype) != np.dtype(dtype):
            raise ValueError(f"{name}: dtype {np.dtype(got.dtype).name}; needs "
                             f"{np.dtype(dtype).name}")
        if tuple(got.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(got.shape)}; needs {shape}"
                             + (" (groups, ceil(K/c), N), N contiguous" if name == "scale"
                                else ""))


def dequantize(problem: GroupedProblem, b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The bf16 operand the MMA sees, (groups, N, K), as float32 values."""
    converted = b.astype(np.float32)
    if problem.mode == "convert_only":
        return converted
    per_k = np.repeat(scale.astype(np.float32), problem.chunk, axis=1)[:, : problem.k, :]
    return (converted * per_k.transpose(0, 2, 1)).astype(ml_dtypes.bfloat16).astype(np.float32)


def _groups(problem: GroupedProblem):
    offsets = problem.row_offsets
    return [(g, slice(offsets[g], offsets[g + 1])) for g in range(problem.groups)]


def oracle(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """D in float64 on the same (rounded) inputs and the same dequantized operand."""
    check_inputs(problem, inputs)
    operand = dequantize(problem, inputs["b"], inputs["scale"]).astype(np.float64)
    a, c = inputs["a"].astype(np.float64), inputs["c"].astype(np.float64)
    out = np.empty(c.shape, np.float64)
    for g, rows in _groups(problem):
        out[rows] = problem.alpha * (a[rows] @ operand[g].T) + problem.beta * c[rows]
    return out


def model(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The kernel's arithmetic in numpy: bf16 operand, fp32 accumulate and epilogue, f16 out."""
    check_inputs(problem, inputs)
    operand = dequantize(problem, inputs["b"], inputs["scale"])
    a, c = inputs["a"].astype(np.float32), inputs["c"].astype(np.float32)
    out = np.empty(c.shape, np.float16)
    alpha, beta = np.float32(problem.alpha), np.float32(problem.beta)
    for g, rows in _groups(problem):
        acc = a[rows] @ operand[g].T  # float32 in, float32 accumulate
        source = beta * c[rows]  # fp32, as the kernel's epilogue
        # fma(alpha, acc, source) in fp32: the product of two fp32 values is exact in
        # float64, so rounding the float64 sum to fp32 gives the fused result (except
        # for a rare double rounding of the sum; the bound covers either).
        fused = (np.float64(alpha) * acc.astype(np.float64) + source).astype(np.float32)
        out[rows] = fused.astype(np.float16)
    return out


def accumulation_bound(problem: GroupedProblem) -> float:
    """The absolute part of a bound on |D - oracle| for any correct fp32-accumulating
    kernel; the relative part is the f16 output rounding U16 (the config's rtol).

    Accumulation in any order: |acc - exact| <= γ_K Σ|a||b| with γ_K = K u/(1 - K u)
    (Higham, Accuracy and Stability, §3.1) and Σ|a||b| <= K max|A| max|dequant(B)|, from
    the supports of the input distributions. The fp32 epilogue adds at most three more
    roundings (alpha·acc, beta·C, the sum), and the f16 output one relative rounding U16
    or, below the normal range, half a subnormal step (added here).
    """
    k = problem.k
    gamma = (k + 3) * U32 / (1 - (k + 3) * U32)
    b_max = B_RANGE[1] * (SCALE_RANGE[1] if problem.mode == "scale_only" else 1.0)
    products = abs(problem.alpha) * k * A_RANGE[1] * b_max + abs(problem.beta) * A_RANGE[1]
    return gamma * products * (1 + U16) + F16_SUBNORMAL_STEP / 2


def example_rule_failures(got: np.ndarray, want: np.ndarray) -> int:
    """Elements the example's check rejects: cutlass::relatively_equal(ref, D, 1e-2, 1e-4)
    evaluated in f16, with the oracle rounded to f16 as the example's reference D is. Where
    |ref| + |D| < 1e-4 (or either is 0) it demands |ref - D| < 1e-6."""
    a, b = want.astype(np.float16), got.astype(np.float16)
    diff = np.abs(a - b)
    eps, floor = np.float16(EXAMPLE_EPSILON), np.float16(EXAMPLE_FLOOR)
    near_zero = (a == 0) | (b == 0) | (np.abs(a) + np.abs(b) < floor)
    ok = np.where(near_zero, diff < eps * floor, diff < eps * (np.abs(a) + np.abs(b)))
    return int(np.count_nonzero(~(ok | (a == b))))


def compare(problem: GroupedProblem, got: np.ndarray, want: np.ndarray,
            tolerance: dict[str, Any]) -> dict[str, Any]:
    """|got - want| <= atol + rtol |want|, the derived accumulation bound added to the
    config's atol; the example's relative rule reported beside it (it does not decide)."""
    atol, rtol = tolerance["atol"] + accumulation_bound(problem), tolerance["rtol"]
    result: dict[str, Any] = {"atol_applied": atol, "rtol_applied": rtol}
    if got.shape != want.shape:
        return {**result, "passed": False, "error": f"shape {got.shape} != oracle {want.shape}",
                "nan_count": 0, "max_abs_error": None, "max_rel_error": None,
                "worst_error_over_tolerance": None}
    values = got.astype(np.float64)
    nan_count = int(np.count_nonzero(~np.isfinite(values)))
    err = np.where(np.isfinite(values), np.abs(values - want), np.inf)
    ratio = err / (atol + rtol * np.abs(want))
    finite = np.where(np.isfinite(err), err, 0.0)
    return {**result,
            "passed": nan_count == 0 and bool(np.all(ratio <= 1)),
            "nan_count": nan_count,
            "max_abs_error": float(finite.max(initial=0.0)),
            "max_rel_error": float((finite / np.maximum(np.abs(want), atol)).max(initial=0.0)),
            "worst_error_over_tolerance": float(ratio.max(initial=0.0)) if not nan_count
            else None,
            "example_rule_failures": example_rule_failures(got, want)}
