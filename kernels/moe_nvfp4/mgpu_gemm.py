"""Masked grouped GEMM on packed NVFP4 operands for NVIDIA Hopper, in Pallas Mosaic GPU.

out[e, m, :] = alpha[e] * deq(A)[e, m, :] @ deq(B)[e]ᵀ for m < masked_m[e]; rows at
or past masked_m[e] are never written (an expert with no rows writes nothing).

Hopper has no FP4 tensor cores, so one CTA (one warpgroup) per (expert, n-block,
m-block) does, per K step of 256:
1. TMA the packed A tile [bm, 128 B] (as two 64-byte halves), its scale bytes [bm, 16],
   the packed B tile and its scale bytes into a ring of ``stages`` slots;
2. decode in registers: codes → float32 (exact), times the e4m3 block scale, to bf16
   (exact: an e2m1 × e4m3 product has at most 6 significant bits). Low nibbles (even K)
   and high nibbles (odd K) go to separate 64-wide tiles: the same K permutation on
   both operands leaves the product unchanged, and no nibble interleave is needed;
3. four bf16 wgmmas (two halves × two nibbles) into one float32 accumulator;
4. epilogue: × alpha, to bf16, stored by TMA — whole tile, or row by row for the last,
   partial block of an expert.

Operand layouts: A [E, M, K/2] bytes with scales [E, M, K/16] (row-major); B is the
weight prepacked once, K-pair-major: [E, K/2, N] bytes (byte (kk, n) holds K = 2kk in
its low and 2kk + 1 in its high nibble) with scales [E, K/16, N], so a decoded B tile is
wgmma's [K, N] operand with no transpose. Per-16 scales reach the registers' layout
by masked row/column maxima and a select chain over the 8 groups of a 64-wide tile.

Constraints: K a multiple of 256; M a multiple of block_m; N of block_n.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_interpret
from kernels.moe_nvfp4 import decode

SMEM_LIMIT_BYTES = 232_448  # Hopper's opt-in dynamic shared memory per block (227 KiB)
K_STEP = 256  # K per pipeline step: 16 scale bytes per row, the smallest TMA box (16 B)
HALF = 64  # bytes of packed K per half step (128 K values); one 64-wide bf16 tile per nibble
WGMMA = plgpu.Layout.WGMMA


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Rows of A and columns of B per CTA, and the depth of the TMA ring."""

    block_m: int = 64
    block_n: int = 64
    stages: int = 2

    def __post_init__(self):
        if self.block_m not in (64, 128):
            raise ValueError(f"{self.block_m=} must be 64 or 128 (one warpgroup's rows)")
        if self.block_n % 64 or not 64 <= self.block_n <= 256:
            raise ValueError(f"{self.block_n=} must be a multiple of 64 in [64, 256]")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")


@dataclasses.dataclass(frozen=True)
class Problem:
    """Experts, rows per expert (capacity), output columns, reduction length."""

    experts: int
    m: int
    n: int
    k: int

    def check(self, config: TuningConfig) -> None:
        if self.k % K_STEP:
            raise ValueError(f"k={self.k} must be a multiple of {K_STEP}")
        if self.m % config.block_m or self.n % config.block_n:
            raise ValueError(f"(m, n)=({self.m}, {self.n}) must be multiples of "
                             f"(block_m, block_n)=({config.block_m}, {config.block_n})")


def _swizzled(shape, dtype, swizzle):
    elems = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)),
                                                plgpu.SwizzleTransform(swizzle)))


def scratch_types(config: TuningConfig) -> dict:
    """The kernel's shared memory by name (also what the budget counts)."""
    bm, bn, st = config.block_m, config.block_n, config.stages
    chunks = bn // 64
    return {
        "a_smem": _swizzled((st, 2, bm, HALF), jnp.uint8, 64),
        "sa_smem": plgpu.SMEM((st, bm, 16), jnp.uint8),
        "b_smem": _swizzled((st, 2 * chunks, HALF, 64), jnp.uint8, 64),
        # Per 64 columns: rows 0-15 this step's 16 scale rows, 16-63 zero (a WGMMA tile).
        "sb_smem": _swizzled((st, chunks, 64, 64), jnp.uint8, 64),
        "a_bf16": _swizzled((2, bm, 64), jnp.bfloat16, 128),
        "b_bf16": _swizzled((2, 64, bn), jnp.bfloat16, 128),
        "o_smem": plgpu.SMEM((bm, bn), jnp.bfloat16),
        "barriers": plgpu.Barrier(num_arrivals=3 + 3 * chunks, num_barriers=st),
    }


def smem_bytes(config: TuningConfig) -> int:
    """Shared memory of the buffers, from their shapes (barriers: 8 bytes each)."""
    total = 0
    for item in scratch_types(config).values():
        if isinstance(item, plgpu.Barrier):
            total += 8 * math.prod(item.num_barriers)
        else:
            total += math.prod(item.shape) * jnp.dtype(item.dtype).itemsize
    return total


def check_budget(config: TuningConfig) -> int:
    """The config's shared memory in bytes; raises naming the config when over the limit."""
    used = smem_bytes(config)
    if used > SMEM_LIMIT_BYTES:
        raise ValueError(f"{config}: {used} bytes of shared memory exceed the "
                         f"{SMEM_LIMIT_BYTES}-byte limit")
    return used


def row_scales(tile, groups: int):
    """u8 [R, G] scale bytes -> G float32 vectors over rows (masked row maxima)."""
    bits = tile.astype(jnp.int32)
    cols = plgpu.broadcasted_iota(jnp.int32, tile.shape, 1, layout=WGMMA)
    return [decode.e4m3(jnp.where(cols == g, bits, 0).max(axis=1)) for g in range(groups)]


def column_scales(tile, groups: int):
    """u8 [64, C] scale bytes (rows = groups) -> float32 vectors over columns."""
    bits = tile.astype(jnp.int32)
    rows = plgpu.broadcasted_iota(jnp.int32, tile.shape, 0, layout=WGMMA)
    return [decode.e4m3(jnp.where(rows == g, bits, 0).max(axis=0)) for g in range(groups)]


def expand(vectors, shape, axis: int):
    """Per-16 scales over a 64-wide tile: 8 groups of 8 along ``1 - axis`` (selects)."""
    index = plgpu.broadcasted_iota(jnp.int32, shape, 1 - axis, layout=WGMMA) // 8
    out = lax.broadcast_in_dim(vectors[0], shape, [axis])
    for g in range(1, 8):
        out = jnp.where(index == g, lax.broadcast_in_dim(vectors[g], shape, [axis]), out)
    return out


def decode_tile(packed, scale):
    """u8 tile and float32 scales of the same shape -> (even K, odd K) bf16 tiles."""
    low = decode.e2m1(packed & 0xF) * scale
    high = decode.e2m1(decode.high_nibble(packed)) * scale
    return low.astype(jnp.bfloat16), high.astype(jnp.bfloat16)


def make(problem: Problem, config: TuningConfig, interpret: Any = None):
    """``f(a, a_scales, b_t, b_scales_t, alpha, masked_m) -> out [E, M, N] bf16``."""
    problem.check(config)
    check_budget(config)
    bm, bn, stages = config.block_m, config.block_n, config.stages
    chunks = bn // 64
    k_steps = problem.k // K_STEP
    if interpret is not None:
        mgpu_interpret.enable_layout_cast_on_host()

    def body(a_ref, sa_ref, b_ref, sb_ref, alpha_ref, masked_ref, out_ref, *, a_smem,
             sa_smem, b_smem, sb_smem, a_bf16, b_bf16, o_smem, barriers):
        e = lax.axis_index("experts")
        m0 = lax.axis_index("m_blocks") * bm
        n0 = lax.axis_index("n_blocks") * bn
        rows = masked_ref[e]

        def issue(step, slot):
            barrier = barriers.at[slot]
            for h in range(2):
                plgpu.copy_gmem_to_smem(
                    a_ref.at[e, pl.ds(m0, bm), pl.ds(step * 2 * HALF + h * HALF, HALF)],
                    a_smem.at[slot, h], barrier)
                for c in range(chunks):
                    plgpu.copy_gmem_to_smem(
                        b_ref.at[e, pl.ds(step * 2 * HALF + h * HALF, HALF),
                                 pl.ds(n0 + c * 64, 64)],
                        b_smem.at[slot, h * chunks + c], barrier)
            plgpu.copy_gmem_to_smem(sa_ref.at[e, pl.ds(m0, bm), pl.ds(step * 16, 16)],
                                    sa_smem.at[slot], barrier)
            for c in range(chunks):
                plgpu.copy_gmem_to_smem(
                    sb_ref.at[e, pl.ds(step * 16, 16), pl.ds(n0 + c * 64, 64)],
                    sb_smem.at[slot, c, pl.ds(0, 16)], barrier)

        def compute(acc):
            def step(t, carry):
                slot = lax.rem(t, stages)
                plgpu.barrier_wait(barriers.at[slot])
                a_groups = row_scales(plgpu.layout_cast(sa_smem[slot], WGMMA), 16)
                for h in range(2):
                    a_scale = expand(a_groups[8 * h:8 * h + 8], (bm, 64), 0)
                    a_bf16[0], a_bf16[1] = decode_tile(a_smem[slot, h], a_scale)
                    for c in range(chunks):
                        b_groups = column_scales(sb_smem[slot, c], 8 * h + 8)[8 * h:]
                        b_scale = expand(b_groups, (64, 64), 1)
                        columns = (slice(None), pl.ds(c * 64, 64))
                        b_bf16[(0, *columns)], b_bf16[(1, *columns)] = decode_tile(
                            b_smem[slot, h * chunks + c], b_scale)
                    plgpu.commit_smem()  # also: every thread has read this half's bytes
                    if h == 1:  # the slot's bytes are all in registers: refill it
                        pl.when(t + stages < k_steps)(lambda: issue(t + stages, slot))
                    for nibble in range(2):
                        plgpu.wgmma(acc, a_bf16.at[nibble], b_bf16.at[nibble])
                    plgpu.wgmma_wait(0)  # the staging tiles are rewritten next
                return carry

            lax.fori_loop(0, k_steps, step, 0)
            return acc[...]

        @pl.when(m0 < rows)
        def _():
            for slot in range(stages):
                for c in range(chunks):
                    sb_smem[slot, c] = plgpu.layout_cast(jnp.zeros((64, 64), jnp.uint8), WGMMA)
            plgpu.commit_smem()
            for t in range(min(stages, k_steps)):
                issue(t, t)
            result = pl.run_scoped(compute, plgpu.ACC((bm, bn), jnp.float32))
            o_smem[...] = (result * alpha_ref[e]).astype(jnp.bfloat16)
            plgpu.commit_smem()

            @pl.when(m0 + bm <= rows)
            def _():
                plgpu.copy_smem_to_gmem(o_smem, out_ref.at[e, pl.ds(m0, bm), pl.ds(n0, bn)])

            @pl.when(m0 + bm > rows)
            def _():
                def store_row(r, carry):
                    plgpu.copy_smem_to_gmem(o_smem.at[pl.ds(r, 1)],
                                            out_ref.at[e, pl.ds(m0 + r, 1), pl.ds(n0, bn)])
                    return carry

                lax.fori_loop(0, rows - m0, store_row, 0)

            plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((problem.experts, problem.m, problem.n), jnp.bfloat16),
        grid=(problem.experts, problem.n // bn, problem.m // bm),
        grid_names=("experts", "n_blocks", "m_blocks"),
        scratch_types=scratch_types(config), interpret=interpret)
    return call


def arg_shapes(problem: Problem) -> tuple[jax.ShapeDtypeStruct, ...]:
    e, m, n, k = problem.experts, problem.m, problem.n, problem.k
    u8 = jnp.uint8
    return (jax.ShapeDtypeStruct((e, m, k // 2), u8), jax.ShapeDtypeStruct((e, m, k // 16), u8),
            jax.ShapeDtypeStruct((e, k // 2, n), u8), jax.ShapeDtypeStruct((e, k // 16, n), u8),
            jax.ShapeDtypeStruct((e,), jnp.float32), jax.ShapeDtypeStruct((e,), jnp.int32))
