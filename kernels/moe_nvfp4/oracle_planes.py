"""The case's oracle: every stage's float64 answer with the bound each kernel must meet.

Each output is a stack of planes, NaN on rows past masked_m (never computed):
- codes ("a1", "a2"): [x·gs, block_amax·gs/6, slack of x·gs, slack of the scale], what
  ``compare.codes`` needs for a tie-aware check of a kernel's codes and scales; a2's
  follow stage 1's output (``a2_planes``): the model's a1 here, which the stage variant
  reads, a whole path's own a1 in ``checks.compare``;
- values ("h", "out", "out_fused", "out_unfused", "out_dense"): [value, bound], the
  bound beyond the output's own bf16 rounding (the tolerance's rtol): f32 accumulation,
  and every code of an earlier stage that may differ from the model's at a rounding
  tie, propagated (``flip_bound``). "out" is GEMM2 of the model's own a2 (no earlier
  stage: the tight check); "out_fused" and "out_unfused" are the whole paths' out, the
  model's with the same planes: their check follows the kernel's own a2 or h
  (``whole_path``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kernels.moe_nvfp4 import numerics, oracle_f64

BF16_HALF_ULP = 2.0**-8


def _blocks(x):
    return x.reshape(*x.shape[:-1], -1, numerics.BLOCK)


def code_planes(x, gs, valid, x_slack) -> np.ndarray:
    """[4, E, M, K] planes of a quantization of x with global scales gs."""
    gs_k = np.asarray(gs, np.float64)[:, None, None]
    scale = np.repeat(numerics.block_scale(x, gs), numerics.BLOCK, axis=-1)
    scale_slack = np.repeat(_blocks(x_slack).max(-1), numerics.BLOCK, axis=-1) * gs_k / 6
    planes = np.stack([np.asarray(x, np.float64) * gs_k, scale, x_slack * gs_k, scale_slack])
    return np.where(valid[None, :, :, None], planes, np.nan)


def half_step(y):
    """Half the e2m1 grid spacing around |y| (saturating at 6): a rounding's largest error."""
    a = np.minimum(np.abs(y), numerics.E2M1_MAX)
    return np.where(a < 2, 0.25, np.where(a < 4, 0.5, 1.0))


def flip_bound(x, gs, x_slack) -> np.ndarray:
    """Per element, how far (in x's units) a kernel's dequantized value may sit from the
    model's: 0 unless its code or its block's scale may differ at a tie (given x's own
    slack); else the two roundings' largest errors plus the slack, each rounding within
    half a step of x (at the model's scale, and at the largest scale the kernel may
    pick)."""
    gs = np.asarray(gs, np.float64)[:, None, None]
    window = numerics.TIE_WINDOW
    exact = numerics.block_scale(x, gs[:, 0, 0])
    slack = numerics.block_scale(x_slack, gs[:, 0, 0]) + exact * window
    sf = numerics.round_e4m3(exact)
    sf_low = np.repeat(numerics.round_e4m3(np.maximum(exact - slack, 0)), numerics.BLOCK, axis=-1)
    sf_high = np.repeat(numerics.round_e4m3(exact + slack), numerics.BLOCK, axis=-1)
    y = numerics.scaled_value(x, gs[:, 0, 0], sf)
    y_slack = np.abs(numerics.scaled_value(x_slack, gs[:, 0, 0], sf)) + np.abs(y) * window
    flag = ((numerics.e2m1_code(y - y_slack) != numerics.e2m1_code(y + y_slack))
            | (sf_low != sf_high))
    with np.errstate(divide="ignore", invalid="ignore"):
        y_kernel = np.where(sf_low > 0, (np.abs(x) + x_slack) * gs / sf_low, numerics.E2M1_MAX)
    sf_k = np.repeat(sf, numerics.BLOCK, axis=-1)
    reach = (half_step(y) * sf_k + half_step(y_kernel) * sf_high) / gs + x_slack
    return np.where(flag, reach, 0.0)


def a2_planes(a1: np.ndarray, inputs: dict[str, np.ndarray], valid: np.ndarray
              ) -> np.ndarray:
    """Stage 3's planes given stage 1's output ``a1`` (dequantized [E, M, K], without
    gs; rows past masked_m ignored): act = SiLU·mul of GEMM1 of that a1, known to GEMM1's
    f32 accumulation and the f32 SiLU·mul (``silu_mul_error``), no tie of stage 1."""
    w1 = numerics.dequantize(inputs["w1_packed"], inputs["w1_scales"])
    alpha = np.asarray(inputs["alpha1"], np.float64)[:, None, None]
    a1 = np.where(valid[..., None], a1, 0.0)
    h = oracle_f64.gemm_nt(a1, w1) * alpha
    h_error = oracle_f64.f32_gemm_error(np.abs(a1), np.abs(w1)) * np.abs(alpha)
    act = oracle_f64.silu_mul(h)
    return code_planes(act, inputs["a2_gs"], valid, oracle_f64.silu_mul_error(h, h_error))


def gemm_bound(a_abs, a_flip, b_abs) -> np.ndarray:
    """f32 accumulation of A·Bᵀ with A possibly off by ``a_flip`` per element."""
    return (oracle_f64.f32_gemm_error(a_abs + a_flip, b_abs)
            + oracle_f64.gemm_nt(a_flip, b_abs))


def oracle(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every stage's planes for one problem (see the module docstring). Experts are
    independent (every input is per expert): from numerics.PARALLEL_FROM hidden elements
    each expert's planes are computed on a thread of its own, bit for bit alike."""
    experts = len(inputs["masked_m"])
    threads = min(experts, numerics.usable_cpus())
    if threads == 1 or inputs["hidden"].size < numerics.PARALLEL_FROM:
        return _planes(inputs)
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(
            lambda e: _planes({name: value[e:e + 1] for name, value in inputs.items()}),
            range(experts)))
    return {name: np.concatenate([part[name] for part in parts], axis=1)
            for name in parts[0]}


def _planes(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    hidden, masked = inputs["hidden"], inputs["masked_m"]
    valid = oracle_f64.valid_rows(masked, hidden.shape[1])
    rows = valid[..., None]
    stages = oracle_f64.moe(hidden, inputs["a1_gs"], (inputs["w1_packed"], inputs["w1_scales"]),
                         inputs["alpha1"], inputs["a2_gs"],
                         (inputs["w2_packed"], inputs["w2_scales"]), inputs["alpha2"], masked)
    h, out = stages["h"], stages["out"]
    # Magnitudes for the bounds, each operand with its global scale: A·Bᵀ = alpha·sum.
    w1 = numerics.dequantize(inputs["w1_packed"], inputs["w1_scales"], inputs["w1_gs"])
    w2 = numerics.dequantize(inputs["w2_packed"], inputs["w2_scales"], inputs["w2_gs"])
    a1 = numerics.dequantize(stages["a1_packed"], stages["a1_scales"], inputs["a1_gs"])
    a2 = numerics.dequantize(stages["a2_packed"], stages["a2_scales"], inputs["a2_gs"])
    zeros = np.zeros_like(hidden, np.float64)
    a1_flip = np.where(rows, flip_bound(hidden, inputs["a1_gs"], zeros), 0.0)
    h_error = gemm_bound(np.abs(a1), a1_flip, np.abs(w1))

    gemm2 = np.stack([out, oracle_f64.f32_gemm_error(np.abs(a2), np.abs(w2))
                      * (1 + BF16_HALF_ULP)])

    dense_h = oracle_f64.gemm_nt(hidden, w1)
    dense_act = oracle_f64.silu_mul(dense_h)
    return {
        "a1": code_planes(hidden, inputs["a1_gs"], valid, zeros),
        # A bf16 output rounds the f32 result: the bound grows by its own rounding.
        "h": np.stack([h, h_error * (1 + BF16_HALF_ULP)]),
        # Through the model's a1, which the stage variant reads; a whole path's a2 is
        # checked through the kernel's own a1 (checks.compare).
        "a2": a2_planes(numerics.dequantize(stages["a1_packed"], stages["a1_scales"]),
                        inputs, valid),
        "out": gemm2,
        # The whole paths' out is the model's; the check follows the kernel's own a2 or h
        # (checks.compare, whole_path), not these planes' bound.
        "out_fused": gemm2,
        "out_unfused": gemm2,
        "out_dense": np.stack([np.where(rows, oracle_f64.gemm_nt(dense_act, w2),
                                        np.nan),
                               dense_bound(hidden, w1, w2, dense_h)]),
    }


def dense_bound(hidden, w1, w2, h) -> np.ndarray:
    """The bf16 dense path (weights rounded to bf16, h and act materialised in bf16, f32
    accumulation): each rounding 2**-8 relative, propagated through both GEMMs."""
    rel = BF16_HALF_ULP
    terms1 = oracle_f64.gemm_nt(np.abs(hidden), np.abs(w1))
    h_error = rel * terms1 + oracle_f64.f32_gemm_error(np.abs(hidden), np.abs(w1))
    h_error += rel * (np.abs(h) + h_error)  # h stored as bf16
    act = oracle_f64.silu_mul(h)
    act_error = oracle_f64.silu_mul_error(h, h_error)
    act_error += rel * (np.abs(act) + act_error)  # act stored as bf16
    act_abs = np.abs(act) + act_error
    return (oracle_f64.gemm_nt(act_error, np.abs(w2))
            + rel * oracle_f64.gemm_nt(act_abs, np.abs(w2))
            + oracle_f64.f32_gemm_error(act_abs, np.abs(w2)))
