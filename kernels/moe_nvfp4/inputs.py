"""One random MoE problem as the case's inputs: what every variant and baseline reads.

Hidden states (bf16 values), NVFP4 weights in the reference's layout and prepacked for
the Hopper kernels, per-expert global scales (calibrated as the reference's 448·6/amax,
a2's on the float64 act), alphas, masked_m, and the model's own stage-1 and stage-3
quantizations (the inputs of the single-stage variants).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from kernels.moe_nvfp4 import layouts, numerics, oracle_f64, problems


def sizes(params: dict[str, Any]) -> tuple[int, int, int, int]:
    """(experts, rows per expert, hidden = GEMM1's K, inter = N)."""
    return params["experts"], params["m"], params["hidden"], params["inter"]


def masked_m(rng: np.random.Generator, params: dict[str, Any]) -> np.ndarray:
    """The upstream benchmark's expected_m · U(0.7, 1.3) (capped at m) when given, else
    uniform in [1, m] with one expert at 0 rows (when there are two or more)."""
    e, m = params["experts"], params["m"]
    if "expected_m" in params:
        drawn = np.round(params["expected_m"] * rng.uniform(0.7, 1.3, e))
        return np.minimum(drawn, m).astype(np.int32)
    return problems.masked_m(rng, e, m)


def make(params: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    e, m, k, n = sizes(params)
    hidden = problems.activations(rng, e, m, k)
    w1_packed, w1_scales, w1_gs = problems.quantized(rng, e, 2 * n, k)
    w2_packed, w2_scales, w2_gs = problems.quantized(rng, e, k, n)
    masked = masked_m(rng, params)
    a1_gs = problems.global_scale(hidden)
    a1_packed, a1_scales = numerics.quantize(hidden, a1_gs)
    alpha1 = (1 / (a1_gs.astype(np.float64) * w1_gs)).astype(np.float32)
    h = oracle_f64.masked_gemm(a1_packed, a1_scales, w1_packed, w1_scales, alpha1, masked)
    act = np.nan_to_num(oracle_f64.silu_mul(h))
    a2_gs = problems.global_scale(act)
    a2_packed, a2_scales = numerics.quantize(act, a2_gs)
    alpha2 = (1 / (a2_gs.astype(np.float64) * w2_gs)).astype(np.float32)
    w1_t, w1_t_scales = layouts.k_pair_major(w1_packed, w1_scales)
    w1_f, w1_f_scales = layouts.fused_w1(w1_packed, w1_scales)
    w1_f_sm100, w1_f_sm100_scales = layouts.fused_w1_sm100(w1_packed, w1_scales)
    w2_t, w2_t_scales = layouts.k_pair_major(w2_packed, w2_scales)
    bf16 = ml_dtypes.bfloat16
    return {
        "hidden": hidden, "hidden_bf16": hidden.astype(bf16), "masked_m": masked,
        "a1_gs": a1_gs, "a2_gs": a2_gs, "alpha1": alpha1, "alpha2": alpha2,
        "w1_packed": w1_packed, "w1_scales": w1_scales, "w1_gs": w1_gs,
        "w2_packed": w2_packed, "w2_scales": w2_scales, "w2_gs": w2_gs,
        "a1_packed": a1_packed, "a1_scales": a1_scales,
        "a2_packed": a2_packed, "a2_scales": a2_scales,
        "w1_t": w1_t, "w1_t_scales": w1_t_scales, "w1_f": w1_f, "w1_f_scales": w1_f_scales,
        "w2_t": w2_t, "w2_t_scales": w2_t_scales,
        "w1_f_sm100": w1_f_sm100, "w1_f_sm100_scales_128x4": w1_f_sm100_scales,
        # Blackwell's block-scaled MMA reads the scales in the reference's 128x4 layout.
        **{f"{name}_128x4": numerics.scale_atoms(scales) for name, scales in (
            ("a1_scales", a1_scales), ("a2_scales", a2_scales), ("w1_scales", w1_scales),
            ("w2_scales", w2_scales))},
        # The dense model's weights: dequantized once, stored in bf16, [E, K, N] (K-major).
        "w1_bf16": np.swapaxes(numerics.dequantize(w1_packed, w1_scales, w1_gs), 1, 2
                               ).astype(bf16),
        "w2_bf16": np.swapaxes(numerics.dequantize(w2_packed, w2_scales, w2_gs), 1, 2
                               ).astype(bf16),
    }
