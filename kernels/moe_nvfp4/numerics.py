"""NVFP4 as the reference defines it, in numpy: the model every kernel is checked against.

A tensor [..., M, K] becomes e2m1 codes (two per byte, even K in the low nibble), one
e4m3 scale per 16 consecutive K elements and a per-expert float32 global scale ``gs``
(reference: ``gs = 448 * 6 / amax``):

    sf = e4m3(block_amax * gs / 6)         q = e2m1(clamp(x * gs / sf, ±6))

both rounded to nearest, ties to even, from exact float64 values (no float32 double
rounding). Small negatives encode as −0 (0x8); a block whose scale rounds to 0 gets all
codes 0. ``swizzle``/``unswizzle`` give the 128x4 scale layout the hardware consumes.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np

E2M1_MAX = 6.0
E4M3_MAX = 448.0
BLOCK = 16  # K elements per scale
# From this many elements a quantization runs in row blocks, one per CPU the process may
# use (the upstream benchmark's weights: 29 M elements at hidden 7168); below, in one piece.
PARALLEL_FROM = 1 << 22
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def round_e2m1(y: np.ndarray) -> np.ndarray:
    """|y| rounded to the e2m1 grid (nearest, ties to even), saturating at 6."""
    y = np.minimum(np.abs(np.asarray(y, np.float64)), E2M1_MAX)
    step = np.where(y < 2, 0.5, np.where(y < 4, 1.0, 2.0))  # the grid's spacing per octave
    return np.minimum(np.round(y / step) * step, E2M1_MAX)


def e2m1_code(y: np.ndarray) -> np.ndarray:
    """The 4-bit code of y (sign bit 0x8 from y's sign, so −0 stays −0)."""
    r = round_e2m1(y)
    magnitude = np.where(r < 2, r * 2, np.where(r < 4, r + 2, r / 2 + 4)).astype(np.uint8)
    return magnitude | np.where(np.signbit(y), 0x8, 0).astype(np.uint8)


def round_e4m3(v: np.ndarray) -> np.ndarray:
    """v >= 0 rounded to e4m3fn (nearest, ties to even, subnormals, saturating at 448)."""
    v = np.asarray(v, np.float64)
    _, exp = np.frexp(v)  # v = f * 2**exp, f in [0.5, 1)
    quantum = np.exp2(np.maximum(exp - 1, -6) - 3.0)  # 3 mantissa bits; subnormal 2**-9
    return np.minimum(np.round(v / quantum) * quantum, E4M3_MAX)


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest, ties to even), as float64: a kernel's bf16 output."""
    return np.asarray(x, np.float64).astype(ml_dtypes.bfloat16).astype(np.float64)


def e4m3_bits(v: np.ndarray) -> np.ndarray:
    """Bytes of values already on the e4m3 grid."""
    return np.asarray(v, np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def e4m3_value(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e2m1_value(codes: np.ndarray) -> np.ndarray:
    return E2M1_VALUES[np.asarray(codes) & 0xF]


def pack(codes: np.ndarray) -> np.ndarray:
    """[..., K] codes -> [..., K/2] bytes, element 2j in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray) -> np.ndarray:
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), np.uint8)
    out[..., 0::2], out[..., 1::2] = packed & 0xF, packed >> 4
    return out


def block_scale(x: np.ndarray, gs: np.ndarray) -> np.ndarray:
    """The exact float64 value the e4m3 block scale rounds: block_amax * gs / 6."""
    x = np.asarray(x, np.float64)
    amax = np.abs(x.reshape(*x.shape[:-1], -1, BLOCK)).max(-1)
    return amax * np.asarray(gs, np.float64)[..., None, None] / E2M1_MAX


def quantize(x: np.ndarray, gs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [E, M, K] with per-expert gs [E] -> (packed codes [E, M, K/2], scale bytes
    [E, M, K/16] in row-major order). Rows are independent: from PARALLEL_FROM elements
    they are quantized in blocks on threads (numpy leaves the GIL), bit for bit alike."""
    blocks = row_blocks(x)
    if len(blocks) == 1:
        return _quantize(x, gs)
    with ThreadPoolExecutor(len(blocks)) as pool:
        parts = list(pool.map(lambda rows: _quantize(x[:, rows], gs), blocks))
    return tuple(np.concatenate(part, axis=1) for part in zip(*parts, strict=True))


def row_blocks(x: np.ndarray) -> list[slice]:
    """x's rows (axis 1) in one block per allowed CPU from PARALLEL_FROM elements, else
    in one."""
    count = usable_cpus() if x.size >= PARALLEL_FROM else 1
    edges = np.linspace(0, x.shape[1], min(count, x.shape[1]) + 1).astype(int).tolist()
    return [slice(lo, hi) for lo, hi in itertools.pairwise(edges)]


def usable_cpus() -> int:
    """The CPUs this process may run on (all of them where the OS cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _quantize(x: np.ndarray, gs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sf = round_e4m3(block_scale(x, gs))
    return pack(codes_for_scales(x, gs, sf)), e4m3_bits(sf)


def scaled_value(x: np.ndarray, gs: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """The exact x * gs / sf that e2m1 rounds (0 where the block scale is 0)."""
    sf_k = np.repeat(np.asarray(sf, np.float64), BLOCK, axis=-1)
    gs = np.asarray(gs, np.float64)[..., None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sf_k > 0, np.asarray(x, np.float64) * gs / sf_k, 0.0)


def codes_for_scales(x: np.ndarray, gs: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """Unpacked codes of x given the block scales' values sf; a zero scale gives code 0."""
    sf_k = np.repeat(sf, BLOCK, axis=-1)
    return np.where(sf_k > 0, e2m1_code(scaled_value(x, gs, sf)), 0).astype(np.uint8)


def dequantize(packed: np.ndarray, scales: np.ndarray, gs: np.ndarray | None = None
               ) -> np.ndarray:
    """codes * block scale (/ gs when given), float64."""
    out = e2m1_value(unpack(packed)) * np.repeat(e4m3_value(scales), BLOCK, axis=-1)
    return out if gs is None else out / np.asarray(gs, np.float64)[..., None, None]


def _atoms(m: int, k_blocks: int) -> tuple[int, int]:
    return -(-m // 128), -(-k_blocks // 4)


def swizzle(scales: np.ndarray) -> np.ndarray:
    """[E, M, K/16] -> [E, Mt*Kt*512] bytes in the 128x4 layout (M padded to 128, K/16
    to 4, padding 0): (M/128, 4, 32, K/64, 4) transposed to (0, 3, 2, 1, 4)."""
    e, m, kb = scales.shape
    mt, kt = _atoms(m, kb)
    padded = np.zeros((e, mt * 128, kt * 4), np.uint8)
    padded[:, :m, :kb] = scales
    tiles = padded.reshape(e, mt, 4, 32, kt, 4).transpose(0, 1, 4, 3, 2, 5)
    return tiles.reshape(e, -1)


def scale_atoms(scales: np.ndarray) -> np.ndarray:
    """[E, M, K/16] -> [E, M/128, K/64, 32, 16]: ``swizzle``'s 512-byte atoms by (row
    block, K block), the shared-memory tile ``tcgen05.cp`` copies to tensor memory."""
    e, m, kb = scales.shape
    return swizzle(scales).reshape(e, *_atoms(m, kb), 32, 16)


def unswizzle(flat: np.ndarray, m: int, k_blocks: int) -> np.ndarray:
    """The inverse of ``swizzle``: [E, Mt*Kt*512] -> [E, M, K/16]."""
    e = flat.shape[0]
    mt, kt = _atoms(m, k_blocks)
    tiles = flat.reshape(e, mt, kt, 32, 4, 4).transpose(0, 1, 4, 3, 2, 5)
    return tiles.reshape(e, mt * 128, kt * 4)[:, :m, :k_blocks]


def swizzled_offset(m: np.ndarray, k: np.ndarray, k_blocks: int) -> np.ndarray:
    """The reference's offset formula for row m, scale column k (one expert)."""
    k_tiles = -(-k_blocks // 4)
    return ((m // 128) * k_tiles * 512 + (k // 4) * 512 + (m % 32) * 16
            + ((m % 128) // 32) * 4 + k % 4)


# Relative: a float32 evaluation of x*gs/sf (two roundings of 2**-24) is this close to it.
TIE_WINDOW = 2.0**-21

