"""The numerics model of the kernel and its error bound against the oracle (numpy only).

The kernel's arithmetic, as CUTLASS example 69 does it: B (fp8 e5m2) is converted to bf16
and, in ScaleOnly mode, multiplied by its scale in bf16 arithmetic, i.e. the dequantized
operand is bf16(float(B) · float(scale)) rounded to nearest even (the product of a 3-bit
and an 8-bit significand is exact in fp32, so this is a single rounding); the GEMM
accumulates in fp32, one wgmma step of 16 K at a time; the epilogue computes, in fp32,
alpha · acc rounded, then fma(beta, C, that) with one rounding, and rounds to f16 (the
order of CUTLASS's Sm90LinearCombinationPtrArray, ``epilogue``).
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
    acc = accumulate(problem, inputs, operand)
    return epilogue(acc, inputs["c"], problem.alpha, problem.beta)


def accumulate(problem: GroupedProblem, inputs: dict[str, np.ndarray],
               operand: np.ndarray | None = None) -> np.ndarray:
    """The fp32 accumulators (sum M, N), the groups' rows stacked as D's: the step's
    products summed, then added to the fp32 accumulator with one rounding, step after
    step."""
    problems.check_inputs(problem, inputs)
    if operand is None:
        operand = problems.dequantize(problem, inputs["b"], inputs["scale"])
    operand, a = operand.astype(np.float64), inputs["a"].astype(np.float64)
    out = np.empty(inputs["c"].shape, np.float32)
    for g, rows in problems.group_rows(problem):
        acc = np.zeros((rows.stop - rows.start, problem.n), np.float32)
        for step in _step_sums(a[rows], operand[g]):
            acc = (acc + step).astype(np.float32)
        out[rows] = acc
    return out


def fma_f32(a, b, c) -> np.ndarray:
    """fma(a, b, c) of fp32 values with one rounding to fp32 (round to nearest even), as
    FFMA. a · b is exact in float64 (two 24-bit significands); the float64 sum is made
    round-to-odd (where it was inexact, by TwoSum's error, its last bit is set), and
    rounding that to fp32 is the single rounding of the exact value, as 53 bits are at
    least 24 + 2 (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums:
    proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008). The
    plain float64 sum rounded to fp32 can round twice: fma(1 + 2⁻²³, 1.5, -2⁻⁶⁰)."""
    a, b, c = (np.asarray(x, np.float32).astype(np.float64) for x in (a, b, c))
    product = a * b
    total = product + c
    with np.errstate(invalid="ignore"):  # inf - inf in the error of an infinite sum
        back = total - product
        error = (product - (total - back)) + (c - back)  # TwoSum: exact sum - total
        even = (total.view(np.int64) & 1) == 0
        inexact = np.isfinite(total) & (error != 0) & even
        towards = np.where(error > 0, np.inf, -np.inf)
    odd = np.where(inexact, np.nextafter(total, towards), total)
    with np.errstate(over="ignore"):
        return odd.astype(np.float32)


def epilogue_f32(acc: np.ndarray, c: np.ndarray, alpha, beta) -> np.ndarray:
    """Example 69's epilogue on the fp32 accumulators, before D's rounding to f16:
    CUTLASS's Sm90LinearCombinationPtrArray, beta · C + (alpha · acc) as two nodes, so
    alpha · acc rounded to fp32 (its FMUL), then fma(beta, C, that) with one rounding (its
    FFMA), C converted exactly from f16. Where beta is 0 the example neither reads C nor
    keeps it (its C fragment cleared): fma(0, 0, alpha · acc), which is alpha · acc with a
    -0 made +0."""
    alpha, beta = np.float32(alpha), np.float32(beta)
    with np.errstate(over="ignore"):  # beyond the fp32 range: inf, as FMUL's
        scaled = alpha * np.asarray(acc, np.float32)
    source = np.asarray(c, np.float32) if beta != 0 else np.zeros(scaled.shape, np.float32)
    return fma_f32(beta, source, scaled)


def epilogue(acc: np.ndarray, c: np.ndarray, alpha, beta) -> np.ndarray:
    """``epilogue_f32`` rounded to f16 to nearest even (F2FP.F16.F32.PACK_AB); beyond the
    f16 range, inf."""
    with np.errstate(over="ignore"):
        return epilogue_f32(acc, c, alpha, beta).astype(np.float16)


def error_bound(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Per output element, the absolute part of a bound on |D - oracle| for a kernel that
    accumulates in fp32 one wgmma step (STEP_K products) at a time; the relative part is
    the f16 output rounding U16 (the config's rtol).

    From the actual operands, in float64: with S_t the exact partial sum after step t and
    P_t the step's Σ|a·b|, each step errs by at most STEP_ERROR (|S_(t-1)| + P_t) (to
    first order; the factor (1 + STEP_ERROR)^steps covers the rest), so the accumulator
    errs by at most E = STEP_ERROR (1 + STEP_ERROR)^steps Σ_t (|S_(t-1)| + P_t). The fp32
    epilogue, t = alpha·acc rounded then fma(beta, C, t) rounded once, adds U32 |alpha·S|
    and, where beta is not 0, U32 (|beta·C| + (1 + U32) |alpha·S|) (where it is 0 the fma
    is exact: t + 0), carrying |alpha| E through both roundings; the f16 output adds one
    relative rounding U16 of the result or, below the normal range, half a subnormal
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
        accumulated = abs(problem.alpha) * growth * carried * (1 + U32) ** 2
        scaled = abs(problem.alpha) * np.abs(partial)
        fused = (U32 * (abs(problem.beta) * np.abs(c[rows]) + (1 + U32) * scaled)
                 if problem.beta else 0.0)
        bound[rows] = (accumulated + U32 * scaled + fused) * (1 + U16) + F16_SUBNORMAL_STEP / 2
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
