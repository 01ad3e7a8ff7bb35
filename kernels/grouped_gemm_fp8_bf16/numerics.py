"""The numerics model of the kernel and its error bound against the oracle (numpy only).

The kernel's arithmetic, as CUTLASS example 69 does it: B (fp8 e5m2) is converted to bf16
and, in ScaleOnly mode, multiplied by its scale in bf16 arithmetic, i.e. the dequantized
operand is bf16(float(B) · float(scale)) rounded to nearest even (the product of a 3-bit
and an 8-bit significand is exact in fp32, so this is a single rounding); the GEMM
accumulates in fp32, one wgmma step of 16 K at a time; the epilogue computes
fma(alpha, acc, beta · C) in fp32 and rounds to f16.
The oracle evaluates the same problem in float64 on the same dequantized operand, so the
model's error against it is fp32 accumulation plus the epilogue and the f16 rounding
only; ``error_bound`` bounds that per element from the actual partial sums.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from kernels.grouped_gemm_fp8_bf16 import problems
from kernels.grouped_gemm_fp8_bf16.problems import GroupedProblem

U16 = 2.0**-11  # unit roundoff of f16 (10 fraction bits)
U32 = 2.0**-24
F16_SUBNORMAL_STEP = 2.0**-24  # spacing of f16 subnormals; half of it bounds their rounding
F16_OVERFLOW = 65520.0  # 65504 + half its ulp: the smallest magnitude f16 rounds to inf
STEP_K = 16  # K per wgmma instruction (m64nNk16): products per accumulator update
# One step's error relative to |accumulator| + Σ|products|: a rounding of the fp32 sum to
# nearest or toward zero (2^-23) plus the alignment of the 17 addends to the largest with
# three guard bits, truncated (17 · 2^-26), as measured on earlier tensor cores (Fasi et
# al., "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021); a GPU run tests it.
STEP_ERROR = 2.0**-21
# The example's own check: cutlass::relatively_equal in f16 with these constants.
EXAMPLE_EPSILON, EXAMPLE_FLOOR = 1e-2, 1e-4


def _step_sums(a: np.ndarray, operand: np.ndarray):
    """Each K step's sum of products, in float64 (M, N), step after step."""
    for k0 in range(0, a.shape[1], STEP_K):
        yield a[:, k0:k0 + STEP_K] @ operand[:, k0:k0 + STEP_K].T


def model(problem: GroupedProblem, inputs: dict[str, np.ndarray],
          operand: np.ndarray | None = None) -> np.ndarray:
    """The kernel's arithmetic in numpy: bf16 operand; fp32 accumulation in the kernel's
    order, one wgmma step of 16 K at a time (the step's products summed, then added to the
    fp32 accumulator with one rounding); fp32 epilogue; f16 out. ``operand`` replaces the
    dequantized B (how a near-miss kernel is modelled)."""
    problems.check_inputs(problem, inputs)
    if operand is None:
        operand = problems.dequantize(problem, inputs["b"], inputs["scale"])
    operand, a = operand.astype(np.float64), inputs["a"].astype(np.float64)
    c = inputs["c"].astype(np.float32)
    out = np.empty(c.shape, np.float16)
    alpha, beta = np.float32(problem.alpha), np.float32(problem.beta)
    for g, rows in problems.group_rows(problem):
        acc = np.zeros((rows.stop - rows.start, problem.n), np.float32)
        for step in _step_sums(a[rows], operand[g]):
            acc = (acc + step).astype(np.float32)
        source = beta * c[rows]  # fp32, as the kernel's epilogue
        # fma(alpha, acc, source) in fp32: the product of two fp32 values is exact in
        # float64, so rounding the float64 sum to fp32 gives the fused result (except
        # for a rare double rounding of the sum; the bound covers either).
        fused = (np.float64(alpha) * acc.astype(np.float64) + source).astype(np.float32)
        with np.errstate(over="ignore"):  # beyond the f16 range: inf, as the kernel's
            out[rows] = fused.astype(np.float16)
    return out


def error_bound(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Per output element, the absolute part of a bound on |D - oracle| for a kernel that
    accumulates in fp32 one wgmma step (STEP_K products) at a time; the relative part is
    the f16 output rounding U16 (the config's rtol).

    From the actual operands, in float64: with S_t the exact partial sum after step t and
    P_t the step's Σ|a·b|, each step errs by at most STEP_ERROR (|S_(t-1)| + P_t) (to
    first order; the factor (1 + STEP_ERROR)^steps covers the rest), so the accumulator
    errs by at most E = STEP_ERROR (1 + STEP_ERROR)^steps Σ_t (|S_(t-1)| + P_t). The fp32
    epilogue fma(alpha, acc, beta·C) adds U32 (|alpha·S| + 2|beta·C|) and the f16 output
    one relative rounding U16 of the result or, below the normal range, half a subnormal
    step.
    """
    problems.check_inputs(problem, inputs)
    operand = problems.dequantize(problem, inputs["b"], inputs["scale"]).astype(np.float64)
    a, c = inputs["a"].astype(np.float64), inputs["c"].astype(np.float64)
    steps = -(-problem.k // STEP_K)
    growth = STEP_ERROR * (1 + STEP_ERROR) ** steps
    bound = np.empty(c.shape, np.float64)
    for g, rows in problems.group_rows(problem):
        partial = np.zeros((rows.stop - rows.start, problem.n))
        carried = np.abs(a[rows]) @ np.abs(operand[g]).T  # Σ_t P_t
        for step in _step_sums(a[rows], operand[g]):
            carried += np.abs(partial)
            partial += step
        accumulated = abs(problem.alpha) * growth * carried * (1 + U32)
        epilogue = U32 * (abs(problem.alpha) * np.abs(partial)
                          + (2 + U32) * abs(problem.beta) * np.abs(c[rows]))
        bound[rows] = (accumulated + epilogue) * (1 + U16) + F16_SUBNORMAL_STEP / 2
    return bound


def example_rule_failures(got: np.ndarray, want: np.ndarray) -> int:
    """Elements the example's check rejects: cutlass::relatively_equal(ref, D, 1e-2, 1e-4)
    evaluated in f16, with the oracle rounded to f16 as the example's reference D is. Where
    |ref| + |D| < 1e-4 (or either is 0) it demands |ref - D| < 1e-6."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf as f16: equal infs pass
        a, b = want.astype(np.float16), got.astype(np.float16)
        diff = np.abs(a - b)
        eps, floor = np.float16(EXAMPLE_EPSILON), np.float16(EXAMPLE_FLOOR)
        near_zero = (a == 0) | (b == 0) | (np.abs(a) + np.abs(b) < floor)
        ok = np.where(near_zero, diff < eps * floor, diff < eps * (np.abs(a) + np.abs(b)))
    return int(np.count_nonzero(~(ok | (a == b))))


_LAST_BOUND: dict = {}  # the last (problem, digest of the inputs) -> its error_bound


def _last_bound(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """``error_bound``, kept for the last problem and inputs (by a digest of their bytes):
    checks of several outputs on one draw (a bias bisection) compute it once."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        digest.update(name.encode() + np.ascontiguousarray(inputs[name]).tobytes())
    key = (problem, digest.hexdigest())
    if key not in _LAST_BOUND:
        _LAST_BOUND.clear()
        _LAST_BOUND[key] = error_bound(problem, inputs)
    return _LAST_BOUND[key]


def compare(problem: GroupedProblem, inputs: dict[str, np.ndarray], got: np.ndarray,
            want: np.ndarray, tolerance: dict[str, Any]) -> dict[str, Any]:
    """|got - want| <= atol + rtol |want| per element, the derived bound (``error_bound``)
    added to the config's atol. An inf passes only where the f16 result may overflow
    (|want| + bound >= F16_OVERFLOW) and has the oracle's sign; a finite value fails
    where it must (|want| - bound >= F16_OVERFLOW); NaN never passes. The example's
    relative rule is reported beside it (it does not decide)."""
    if got.shape != want.shape:
        return {"passed": False, "error": f"shape {got.shape} != oracle {want.shape}",
                "nan_count": 0, "max_abs_error": None, "max_rel_error": None,
                "worst_error_over_tolerance": None}
    atol, rtol = tolerance["atol"] + _last_bound(problem, inputs), tolerance["rtol"]
    values = got.astype(np.float64)
    finite = np.isfinite(values)
    may_overflow = np.abs(want) + atol >= F16_OVERFLOW
    must_overflow = np.abs(want) - atol >= F16_OVERFLOW
    overflowed = np.isinf(values) & may_overflow & (np.sign(values) == np.sign(want))
    wrong = ~(finite | overflowed) | (finite & must_overflow)
    err = np.where(finite, np.abs(values - want), 0.0)
    ratio = err / (atol + rtol * np.abs(want))
    bad = int(np.count_nonzero(wrong))
    return {"atol_applied": {"min": float(atol.min(initial=np.inf)),
                             "median": float(np.median(atol)) if atol.size else None,
                             "max": float(atol.max(initial=0.0))},
            "rtol_applied": rtol,
            "passed": bad == 0 and bool(np.all(ratio <= 1)),
            "nan_count": bad,
            "overflow_count": int(np.count_nonzero(overflowed)),
            "max_abs_error": float(err.max(initial=0.0)),
            "max_rel_error": float((err / np.maximum(np.abs(want), atol)).max(initial=0.0)),
            "worst_error_over_tolerance": None if bad else float(ratio.max(initial=0.0)),
            "example_rule_failures": example_rule_failures(got, want)}
