"""Grouped NVFP4 quantize for NVIDIA Hopper in Pallas Mosaic GPU.

x [E, M, K] bf16 and per-expert global scales gs [E] -> packed e2m1 codes [E, M, K/2]
and e4m3 block scales, written in one of two placements (``QuantizeConfig``): row-major
[E, M, K/16], the Hopper GEMM's layout (only rows below masked_m written); or the
reference's 128x4 layout [E, M/128 · K/64 · 512] that Blackwell's block-scaled MMA
reads (whole 128-row atoms written): per 128 rows and 16 scale columns, the kernel
copies four 32-row slabs of its [128, 16] scale tile into each of four 512-byte atoms
in shared memory (the layout's (m%32, (m%128)/32, k%4) interleave), then one TMA store.

One CTA (one warpgroup) per (expert, row block); blocks wholly past masked_m[e] are
skipped, and only rows below masked_m[e] are stored. x arrives as uint32 pairs (a free
bitcast outside the kernel), so even K (low half) and odd K (high half) come apart with
a shift and a mask, and the low and high nibbles of each output byte are computed side
by side (``quantize_pair``, shared with the fused kernel). Per 16-element block: amax
by masked row maxima, sf = e4m3(amax * gs / 6), codes e2m1(x * gs / sf), in float32
with ties to even (``encode``). A float32 evaluation may pick the other code where the
exact value sits at a rounding tie, so the kernel is checked tie-aware.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_interpret
from kernels.moe_nvfp4 import arguments, encode
from kernels.moe_nvfp4.mgpu_mainloop import WGMMA, row_staging, store_valid_rows, swizzled

K_STEP = 128  # K per step: one 64-byte packed tile and 8 scale bytes per row
SCALE_LAYOUTS = ("row_major", "swizzled_128x4")


# What an ablation that takes the scales as given uses for every block's scale (1.0, e4m3
# byte 0x38): no amax, no scale rounding per block (``quantize_pair``'s ``given_scale``).
GIVEN_SCALE = (1.0, 0x38)


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """Rows per CTA, and where the scales go: ``row_major`` or ``swizzled_128x4``;
    ``produce_scales`` off (an ablation): every block takes ``GIVEN_SCALE``."""

    block_m: int = 64
    scale_layout: str = "row_major"
    produce_scales: bool = True

    def __post_init__(self):
        if self.block_m not in (64, 128):
            raise ValueError(f"{self.block_m=} must be 64 or 128 (one warpgroup's rows)")
        if self.scale_layout not in SCALE_LAYOUTS:
            raise ValueError(f"{self.scale_layout=} must be one of {SCALE_LAYOUTS}")
        if self.scale_layout == "swizzled_128x4" and self.block_m != 128:
            raise ValueError(f"{self.block_m=} must be 128 for the 128x4 layout (one atom "
                             "row per CTA)")


def quantize_pair(even, odd, gs, layout=WGMMA, given_scale: tuple[float, int] | None = None):
    """float32 [R, W] tiles of even and odd K (2W K per row: W/8 blocks of 16, W a
    multiple of 8), in ``layout`` -> (packed int32 bytes [R, W], W/8 int32 vectors of
    scale bytes over rows). ``given_scale`` (value, byte), an ablation's: every block
    takes that scale, none is produced."""
    groups = even.shape[1] // 8
    if given_scale is not None:
        value, byte = given_scale
        rows = plgpu.broadcasted_iota(jnp.int32, even.shape[:1], 0, layout=layout.reduce(1))
        negative = (lax.bitcast_convert_type(even, jnp.int32) < 0,
                    lax.bitcast_convert_type(odd, jnp.int32) < 0)
        packed = (encode.e2m1(even * (gs / value), negative[0])
                  | (encode.e2m1(odd * (gs / value), negative[1]) << 4))
        return packed, [rows * 0 + byte] * groups
    cols = plgpu.broadcasted_iota(jnp.int32, even.shape, 1, layout=layout) // 8
    magnitude = jnp.maximum(jnp.abs(even), jnp.abs(odd))
    scales = [encode.e4m3(jnp.where(cols == g, magnitude, 0.0).max(axis=1) * gs / 6.0)
              for g in range(groups)]
    sf = lax.broadcast_in_dim(scales[0][0], even.shape, [0])
    for g in range(1, groups):
        sf = jnp.where(cols == g, lax.broadcast_in_dim(scales[g][0], even.shape, [0]), sf)
    zero = sf == 0.0
    divisor = jnp.where(zero, 1.0, sf)

    def codes(x):
        negative = lax.bitcast_convert_type(x, jnp.int32) < 0
        return encode.e2m1(x * gs / divisor, negative)

    return jnp.where(zero, 0, codes(even) | (codes(odd) << 4)), [b for _, b in scales]


def merge_scale_bytes(s_smem, vectors, half):
    """Write 8 scale-byte vectors into columns 8*half.. of the [R, 16] scale tile (two
    128-K steps fill one 16-byte TMA row)."""
    s_smem[...] = scale_tile(vectors, s_smem.shape, 8 * half,
                             plgpu.layout_cast(s_smem[...], WGMMA).astype(jnp.int32))


def scale_tile(vectors, shape, first: int, tile, layout=WGMMA):
    """``tile`` [R, C] (int32, in ``layout``) with columns first.. replaced by the scale
    byte vectors, as uint8."""
    cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=layout)
    for g, byte in enumerate(vectors):
        tile = jnp.where(cols == first + g, lax.broadcast_in_dim(byte, shape, [0]), tile)
    return tile.astype(jnp.uint8)


def store_atoms(s_smem, atoms_smem, s_ref, e, m_block, atom0):
    """A [128, 16] scale tile as four 512-byte atoms of the 128x4 layout (slab q of 32
    rows, 4 columns each: the (m%32, (m%128)/32, k%4) interleave), TMA-stored to
    s_ref[e, m_block, atom0:atom0 + 4]."""
    for q in range(4):
        for kt in range(4):
            atoms_smem[kt, :, pl.ds(4 * q, 4)] = s_smem[pl.ds(32 * q, 32), pl.ds(4 * kt, 4)]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(atoms_smem, s_ref.at[e, m_block, pl.ds(atom0, 4)])


def make(experts: int, m: int, k: int, config: QuantizeConfig, interpret: Any = None):
    """``f(x [E, M, K] bf16, gs [E] f32, masked_m [E] i32) -> (packed, scales)``."""
    bm = config.block_m
    if k % 256 or m % bm:
        raise ValueError(f"k={k} must be a multiple of 256 and m={m} of block_m={bm}")
    if interpret is not None:
        mgpu_interpret.prepare_host_interpreter()

    swizzle = config.scale_layout == "swizzled_128x4"
    given = None if config.produce_scales else GIVEN_SCALE

    def body(x_ref, gs_ref, masked_ref, q_ref, s_ref, x_smem, q_smem, s_smem, q_rows, s_rows,
             barrier, atoms_smem=None):
        e = lax.axis_index("experts")
        m0 = lax.axis_index("m_blocks") * bm
        rows = masked_ref[e]

        @pl.when(m0 < rows)
        def _():
            def step(t, carry):
                plgpu.copy_gmem_to_smem(x_ref.at[e, pl.ds(m0, bm), pl.ds(t * 64, 64)],
                                        x_smem, barrier)
                plgpu.barrier_wait(barrier)
                words = x_smem[...]
                even = lax.bitcast_convert_type(words << 16, jnp.float32)
                odd = lax.bitcast_convert_type(words & jnp.uint32(0xFFFF0000), jnp.float32)
                packed, scale_bytes = quantize_pair(even, odd, gs_ref[e], given_scale=given)
                plgpu.commit_smem()  # every thread has read x_smem before it is refilled
                q_smem[...] = packed.astype(jnp.uint8)
                half = lax.rem(t, 2)
                merge_scale_bytes(s_smem, scale_bytes, half)
                plgpu.commit_smem()
                store_valid_rows(q_smem, q_ref, e, m0, t * 64, rows, bm, 64, q_rows)

                @pl.when(half == 1)
                def _():
                    if swizzle:
                        store_atoms(s_smem, atoms_smem, s_ref, e,
                                    lax.axis_index("m_blocks"), 4 * (t // 2))
                    else:
                        store_valid_rows(s_smem, s_ref, e, m0, (t - 1) * 8, rows, bm, 16,
                                         s_rows)

                plgpu.wait_smem_to_gmem(0)
                return carry

            lax.fori_loop(0, k // K_STEP, step, 0)

    scratch = dict(x_smem=swizzled((bm, 64), jnp.uint32, 128),
                   q_smem=plgpu.SMEM((bm, 64), jnp.uint8), s_smem=plgpu.SMEM((bm, 16), jnp.uint8),
                   q_rows=row_staging(bm, 64, jnp.uint8), s_rows=row_staging(bm, 16, jnp.uint8),
                   barrier=plgpu.Barrier(num_arrivals=1))
    # The 128x4 layout as [E, M/128, K/64, 32, 16]: one [4, 32, 16] box per 256 K.
    scales_shape = (experts, m // 128, k // 64, 32, 16) if swizzle else (experts, m, k // 16)
    if swizzle:
        scratch["atoms_smem"] = plgpu.SMEM((4, 32, 16), jnp.uint8)
    call = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((experts, m, k // 2), jnp.uint8),
                  jax.ShapeDtypeStruct(scales_shape, jnp.uint8)),
        grid=(experts, m // bm), grid_names=("experts", "m_blocks"),
        scratch_types=scratch, interpret=interpret)

    def quantize(x, gs, masked_m):
        """(packed, scales): scales [E, M, K/16], or [E, M·K/16] in the 128x4 layout."""
        words = lax.bitcast_convert_type(x.reshape(experts, m, k // 2, 2), jnp.uint32)
        packed, scales = call(words, gs, masked_m)
        return packed, scales.reshape(experts, -1) if swizzle else scales

    shapes = (jax.ShapeDtypeStruct((experts, m, k), jnp.bfloat16),
              jax.ShapeDtypeStruct((experts,), jnp.float32),
              jax.ShapeDtypeStruct((experts,), jnp.int32))
    return arguments.checked(quantize, ("x", "gs", "masked_m"), shapes, m)

