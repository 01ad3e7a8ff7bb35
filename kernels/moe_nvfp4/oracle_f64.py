"""The masked NVFP4 MoE in float64: the four stages, masked_m and per-expert alpha.

Stage 1 quantizes hidden states [E, M, K] with a1_gs; stage 2 is the masked grouped GEMM
with w1 [E, 2N, K] and alpha1 = 1 / (a1_gs * w1_gs); stage 3 is SiLU(first half) times
the second half, requantized with a2_gs; stage 4 is the GEMM with w2 [E, K, N] and
alpha2 = 1 / (a2_gs * w2_gs). Rows at or past masked_m[e] are not computed: the kernels
leave them untouched, and the model marks them NaN.
"""

from __future__ import annotations

import numpy as np

from kernels.moe_nvfp4 import numerics


def masked_gemm(a_packed, a_scales, b_packed, b_scales, alpha, masked_m) -> np.ndarray:
    """out[e, m] = alpha[e] * deq(A)[e, m] @ deq(B)[e]^T for m < masked_m[e], else NaN."""
    a = numerics.dequantize(a_packed, a_scales)
    b = numerics.dequantize(b_packed, b_scales)
    out = gemm_nt(a, b) * np.asarray(alpha, np.float64)[:, None, None]
    return np.where(valid_rows(masked_m, a.shape[1])[..., None], out, np.nan)


def gemm_nt(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per expert, A·Bᵀ in float64 ([E, M, K] and [E, N, K] -> [E, M, N]) on BLAS: every
    product of two dequantized NVFP4 or bf16 values is exact in float64, so only the sum's
    order, a few ulps of float64, differs from any other evaluation."""
    return np.matmul(np.asarray(a, np.float64), np.swapaxes(np.asarray(b, np.float64), 1, 2))


def valid_rows(masked_m, m: int) -> np.ndarray:
    """[E, M] booleans: row m of expert e is computed."""
    return np.arange(m)[None, :] < np.asarray(masked_m)[:, None]


def silu_mul(h: np.ndarray) -> np.ndarray:
    """SiLU of the first half of the last axis times the second half (float64)."""
    gate, up = np.split(np.asarray(h, np.float64), 2, axis=-1)
    with np.errstate(over="ignore"):  # exp(-gate) = inf for gate << 0: SiLU -> -0
        return gate / (1.0 + np.exp(-gate)) * up


def f32_gemm_error(a_abs: np.ndarray, b_abs: np.ndarray) -> np.ndarray:
    """A bound on |f32 kernel - float64| of a GEMM of |A| [E, M, K] and |B| [E, N, K]
    (dequantized, alpha folded in) before any output rounding: K f32 additions, each
    within 2**-24 of a running sum bounded by the sum of |products|, and the alpha
    product (2**-24 relative), doubled for margin."""
    return 2 * (a_abs.shape[-1] + 1) * 2.0**-24 * gemm_nt(a_abs, b_abs)


SILU_SLOPE_MAX = 1.1  # |SiLU'| <= 1.0998 everywhere: its extremes, at x = ±2.3994


def silu_slope(gate: np.ndarray, error: np.ndarray) -> np.ndarray:
    """The largest |SiLU'| over [gate − error, gate + error]. SiLU'' has the sign of
    2 − x·tanh(x/2), so SiLU' is monotone between its two extremes and |SiLU'| peaks at
    the interval's ends, unless the interval holds an extreme: then SILU_SLOPE_MAX."""
    low, high = gate - error, gate + error

    def slope(x):
        with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0: sigmoid 0
            sigmoid = 1.0 / (1.0 + np.exp(-x))
        return np.abs(sigmoid * (1.0 + x * (1.0 - sigmoid)))

    rising_low, rising_high = (x * np.tanh(x / 2) < 2 for x in (low, high))
    extreme = (rising_low != rising_high) | ((low < 0) & (high > 0) & ~rising_low)
    return np.where(extreme, SILU_SLOPE_MAX, np.maximum(slope(low), slope(high)))


def silu_mul_error(h: np.ndarray, h_error: np.ndarray) -> np.ndarray:
    """A bound on SiLU(gate)·up's error given h's error bound: SiLU moves by at most
    ``silu_slope`` over gate's interval times gate's error, and the float32 exp, division
    and products add 2**-20 of the computed |SiLU(gate)·up|."""
    gate, up = np.split(np.asarray(h, np.float64), 2, axis=-1)
    gate_error, up_error = np.split(h_error, 2, axis=-1)
    with np.errstate(over="ignore"):
        silu = np.abs(gate / (1.0 + np.exp(-gate)))
    silu_error = silu_slope(gate, gate_error) * gate_error
    up_reach = np.abs(up) + up_error
    return silu_error * up_reach + silu * up_error + 2.0**-20 * (silu + silu_error) * up_reach


def sum_is_exact_in_f32(a_packed, a_scales, b_packed, b_scales) -> bool:
    """Whether every partial sum of every output, in any order, is exact in float32.

    All products are multiples of the smallest nonzero product's quantum q (a power of
    two); when the sum of |products| of each output stays below 2**24 * q, every partial
    sum is an integer multiple of q under 2**24 * q, hence exact. Then an f32 accumulator
    gives the float64 sum bit for bit, whatever the order.
    """
    a = numerics.dequantize(a_packed, a_scales)
    b = numerics.dequantize(b_packed, b_scales)
    products = np.abs(a[:, :, None, :] * b[:, None, :, :])
    nonzero = products[products > 0]
    if nonzero.size == 0:
        return True
    # A product's quantum is its lowest set bit (products hold at most 12 significant bits).
    mantissa, exponent = np.frexp(nonzero)
    scaled = (mantissa * 2.0**53).astype(np.int64)  # exact: 53-bit integers
    quantum = np.ldexp(np.float64(scaled & -scaled), exponent - 53)
    return bool(products.sum(-1).max() < 2.0**24 * quantum.min())


def moe(hidden, a1_gs, w1, alpha1, a2_gs, w2, alpha2, masked_m) -> dict[str, np.ndarray]:
    """The four stages in float64 (w1, w2: (packed, scales); alphas as the caller passes
    them, in float32 like the reference's); every stage's output by name, rows past
    masked_m NaN (act: 0)."""
    a1_packed, a1_scales = numerics.quantize(hidden, a1_gs)
    h = masked_gemm(a1_packed, a1_scales, *w1, alpha1, masked_m)
    act = np.nan_to_num(silu_mul(h))
    a2_packed, a2_scales = numerics.quantize(act, a2_gs)
    out = masked_gemm(a2_packed, a2_scales, *w2, alpha2, masked_m)
    return {"a1_packed": a1_packed, "a1_scales": a1_scales, "h": h, "act": act,
            "a2_packed": a2_packed, "a2_scales": a2_scales, "out": out}
