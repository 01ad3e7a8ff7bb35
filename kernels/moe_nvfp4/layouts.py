"""Weight layouts the Hopper kernels read, prepacked once from the reference's layout
(numpy; a model is loaded once, so this costs nothing per call)."""

from __future__ import annotations

import numpy as np

from kernels.moe_nvfp4 import numerics

FUSED_BLOCK = 128  # act columns per fused pass: 64 even + 64 odd, for gate and for up


def k_pair_major(packed: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A weight [E, N, K/2] (+ scales [E, N, K/16]) -> [E, K/2, N] bytes, byte (kk, n)
    holding K = 2kk (low nibble) and 2kk + 1 (high) of column n, and scales [E, K/16, N]:
    wgmma's [K, N] operand without a transpose."""
    codes = np.swapaxes(numerics.unpack(packed), -1, -2)
    pairs = (codes[..., 0::2, :] | (codes[..., 1::2, :] << 4)).astype(np.uint8)
    return pairs, np.ascontiguousarray(np.swapaxes(scales, -1, -2))


def gate_up_order(n: int) -> np.ndarray:
    """Column order of W1 [2N rows: gate then up] for the fused kernel: per 128 act
    columns, gate's even, gate's odd, up's even, up's odd columns (64 each), so one
    pass's four accumulators hold SiLU·mul's even and odd outputs apart, ready to pack
    two codes per byte with no interleave."""
    if n % FUSED_BLOCK:
        raise ValueError(f"n={n} must be a multiple of {FUSED_BLOCK}")
    blocks = np.arange(0, n, FUSED_BLOCK)[:, None]
    even = blocks + np.arange(0, FUSED_BLOCK, 2)
    return np.concatenate([even, even + 1, n + even, n + even + 1], axis=1).ravel()


def fused_w1(packed: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W1 [E, 2N, K/2] (+ scales) prepacked for the fused kernel."""
    pairs, pair_scales = k_pair_major(packed, scales)
    order = gate_up_order(packed.shape[-2] // 2)
    return np.ascontiguousarray(pairs[..., order]), np.ascontiguousarray(pair_scales[..., order])


def fused_w1_sm100(packed: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W1 [E, 2N, K/2] (+ row-major scales [E, 2N, K/16]) prepacked for Blackwell's fused
    kernel: rows in ``gate_up_order`` (codes stay K-major, as the MMA reads them), their
    scales in the 128x4 layout's atoms [E, 2N/128, K/64, 32, 16]."""
    order = gate_up_order(packed.shape[-2] // 2)
    return (np.ascontiguousarray(packed[..., order, :]),
            numerics.scale_atoms(np.ascontiguousarray(scales[..., order, :])))
