"""Random NVFP4 MoE problems: activations, quantized weights, global scales, masked_m."""

from __future__ import annotations

import numpy as np

from kernels.moe_nvfp4 import numerics


def global_scale(x: np.ndarray) -> np.ndarray:
    """The reference's per-expert float32 global scale 448 * 6 / amax."""
    amax = np.abs(np.nan_to_num(x)).reshape(x.shape[0], -1).max(-1).astype(np.float32)
    safe = np.where(amax > 0, amax, np.float32(1))  # an expert with nothing to scale: 1
    return np.where(amax > 0, np.float32(numerics.E4M3_MAX * numerics.E2M1_MAX) / safe,
                    np.float32(1)).astype(np.float32)


def activations(rng: np.random.Generator, e: int, m: int, k: int) -> np.ndarray:
    """bf16-representable activations with per-block magnitudes over a few octaves."""
    import ml_dtypes

    x = rng.standard_normal((e, m, k)) * np.exp2(rng.integers(-3, 4, (e, m, k // 16, 1))
                                                  ).repeat(16, -1).reshape(e, m, k)
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def quantized(rng: np.random.Generator, e: int, rows: int, k: int, exact: bool = False):
    """(packed, scales, gs) of a random [E, rows, K] tensor. ``exact``: random codes with
    scales in [1, 2) (e4m3 exponent 0), so GEMM sums stay exact in float32 for K <= 512."""
    if exact:
        codes = rng.integers(0, 16, (e, rows, k), dtype=np.uint8)
        scales = numerics.e4m3_bits(1 + rng.integers(0, 8, (e, rows, k // 16)) / 8)
        return numerics.pack(codes), scales, np.ones(e, np.float32)
    x = activations(rng, e, rows, k)
    gs = global_scale(x)
    packed, scales = numerics.quantize(x, gs)
    return packed, scales, gs


def masked_m(rng: np.random.Generator, e: int, m: int) -> np.ndarray:
    """Rows per expert in [0, m], one expert with none and one full when e allows."""
    counts = rng.integers(1, m + 1, e)
    if e >= 2:
        counts[rng.integers(e)] = 0
    return counts.astype(np.int32)
