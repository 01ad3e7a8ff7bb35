"""The K loop every NVFP4 kernel here shares: TMA ring → decode in registers → bf16 wgmma.

Per K step of 256 (``K_STEP``) and per CTA tile of ``block_m`` rows of A and
``chunks`` 64-column chunks of B (at column starts the caller chooses):
1. TMA the packed A tile [bm, 128 B] (as two 64-byte halves), its scale bytes [bm, 16],
   each B chunk [128 B of K, 64] and its scale bytes [16, 64] into slot ``t % stages``;
2. decode in registers: codes → float32 (exact), times the e4m3 block scale, to bf16
   (exact: an e2m1 × e4m3 product has at most 6 significant bits). Low nibbles (even K)
   and high nibbles (odd K) go to separate 64-wide tiles: the same K permutation on both
   operands leaves the product unchanged, and no nibble interleave is needed;
3. two bf16 wgmmas per half step (low, high nibbles), issued by the caller's ``mma``.

A is [E, M, K/2] bytes with row-major scales [E, M, K/16]; B is a weight prepacked
once, K-pair-major: [E, K/2, N] bytes (byte (kk, n) holds K = 2kk in its low and 2kk + 1
in its high nibble) with scales [E, K/16, N], so a decoded B tile is wgmma's [K, N]
operand with no transpose. Per-16 scales reach the registers' layout by masked
row/column maxima and a select chain over the 8 groups of a 64-wide tile. B's scale
rows land in rows 0-15 of a 64-row tile whose other rows stay zero, so the tile has
the WGMMA layout.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_lowering
from kernels.moe_nvfp4 import decode

SMEM_LIMIT_BYTES = 232_448  # Hopper's opt-in dynamic shared memory per block (227 KiB)
REDUCTION_SCRATCH_BYTES = plgpu.CompilerParams().reduction_scratch_bytes
K_STEP = 256  # K per pipeline step: 16 scale bytes per row, the smallest TMA box (16 B)
HALF = 64  # bytes of packed K per half step (128 K values): one 64-wide tile per nibble
TMA_SMEM_ALIGN = 128  # bytes: the alignment of a TMA copy's shared-memory address
WGMMA = plgpu.Layout.WGMMA


def swizzled(shape, dtype, swizzle):
    """SMEM in the tiled, swizzled layout TMA writes and wgmma reads."""
    elems = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)),
                                                plgpu.SwizzleTransform(swizzle)))


def scratch_types(block_m: int, chunks: int, stages: int) -> dict:
    """The K loop's shared memory by name."""
    return {
        "a_smem": swizzled((stages, 2, block_m, HALF), jnp.uint8, 64),
        "sa_smem": plgpu.SMEM((stages, block_m, 16), jnp.uint8),
        "b_smem": swizzled((stages, 2 * chunks, HALF, 64), jnp.uint8, 64),
        "sb_smem": swizzled((stages, chunks, 64, 64), jnp.uint8, 64),
        "a_bf16": swizzled((2, block_m, 64), jnp.bfloat16, 128),
        "b_bf16": swizzled((2, 64, 64 * chunks), jnp.bfloat16, 128),
        "barriers": plgpu.Barrier(num_arrivals=3 + 3 * chunks, num_barriers=stages),
    }


def budget_bytes(scratch: dict) -> int:
    """Shared memory a kernel of this case asks for: its buffers, plus the scratch Pallas
    adds for in-register reductions (every kernel here reduces: the block scales' maxima),
    which the lowering counts against the same limit."""
    return mgpu_lowering.scratch_bytes(scratch) + REDUCTION_SCRATCH_BYTES


def check_budget(name: str, scratch: dict) -> int:
    """Bytes of shared memory; raises naming the configuration when over the limit."""
    used = budget_bytes(scratch)
    if used > SMEM_LIMIT_BYTES:
        raise ValueError(f"{name}: {used} bytes of shared memory exceed the "
                         f"{SMEM_LIMIT_BYTES}-byte limit")
    return used


def row_scales(tile, groups: int):
    """u8 [R, G] scale bytes -> G float32 vectors over rows (masked row maxima)."""
    bits = tile.astype(jnp.int32)
    cols = plgpu.broadcasted_iota(jnp.int32, tile.shape, 1, layout=WGMMA)
    return [decode.e4m3(jnp.where(cols == g, bits, 0).max(axis=1)) for g in range(groups)]


def column_scales(tile, groups: range):
    """u8 [64, C] scale bytes (rows = groups) -> float32 vectors over columns."""
    bits = tile.astype(jnp.int32)
    rows = plgpu.broadcasted_iota(jnp.int32, tile.shape, 0, layout=WGMMA)
    return [decode.e4m3(jnp.where(rows == g, bits, 0).max(axis=0)) for g in groups]


def expand(vectors, shape, axis: int):
    """Per-16 scales over a 64-wide tile: 8 groups of 8 along ``1 - axis`` (selects)."""
    index = plgpu.broadcasted_iota(jnp.int32, shape, 1 - axis, layout=WGMMA) // 8
    out = lax.broadcast_in_dim(vectors[0], shape, [axis])
    for g in range(1, 8):
        out = jnp.where(index == g, lax.broadcast_in_dim(vectors[g], shape, [axis]), out)
    return out


def decode_tile(packed, scale):
    """u8 tile and float32 scales of its shape -> (even K, odd K) bf16 tiles."""
    low = decode.e2m1(packed & 0xF) * scale
    high = decode.e2m1(decode.high_nibble(packed)) * scale
    return low.astype(jnp.bfloat16), high.astype(jnp.bfloat16)


def clear_b_scales(smem: dict, stages: int, chunks: int) -> None:
    """Zero the B scale tiles once: rows 16-63 are never written by TMA."""
    for slot in range(stages):
        for c in range(chunks):
            smem["sb_smem"][slot, c] = plgpu.layout_cast(jnp.zeros((64, 64), jnp.uint8), WGMMA)
    plgpu.commit_smem()


def k_loop(refs, smem: dict, e, m0, b_columns: Callable[[int], object], *, block_m: int,
           chunks: int, stages: int, k_steps: int, mma: Callable[[int], None]) -> None:
    """Run the K loop of one tile; ``mma(nibble)`` issues the wgmmas of a staged half
    (``smem["a_bf16"].at[nibble]`` times ``smem["b_bf16"].at[nibble]``)."""
    a_ref, sa_ref, b_ref, sb_ref = refs
    a_smem, sa_smem, b_smem, sb_smem = (smem[k] for k in ("a_smem", "sa_smem", "b_smem",
                                                        "sb_smem"))
    a_bf16, b_bf16, barriers = smem["a_bf16"], smem["b_bf16"], smem["barriers"]

    def issue(step, slot):
        barrier = barriers.at[slot]
        for h in range(2):
            k0 = step * 2 * HALF + h * HALF
            plgpu.copy_gmem_to_smem(a_ref.at[e, pl.ds(m0, block_m), pl.ds(k0, HALF)],
                                    a_smem.at[slot, h], barrier)
            for c in range(chunks):
                plgpu.copy_gmem_to_smem(b_ref.at[e, pl.ds(k0, HALF), pl.ds(b_columns(c), 64)],
                                        b_smem.at[slot, h * chunks + c], barrier)
        plgpu.copy_gmem_to_smem(sa_ref.at[e, pl.ds(m0, block_m), pl.ds(step * 16, 16)],
                                sa_smem.at[slot], barrier)
        for c in range(chunks):
            plgpu.copy_gmem_to_smem(sb_ref.at[e, pl.ds(step * 16, 16), pl.ds(b_columns(c), 64)],
                                    sb_smem.at[slot, c, pl.ds(0, 16)], barrier)

    def step(t, carry):
        slot = lax.rem(t, stages)
        plgpu.barrier_wait(barriers.at[slot])
        a_groups = row_scales(plgpu.layout_cast(sa_smem[slot], WGMMA), 16)
        for h in range(2):
            a_scale = expand(a_groups[8 * h:8 * h + 8], (block_m, 64), 0)
            a_bf16[0], a_bf16[1] = decode_tile(a_smem[slot, h], a_scale)
            for c in range(chunks):
                b_scale = expand(column_scales(sb_smem[slot, c], range(8 * h, 8 * h + 8)),
                                 (64, 64), 1)
                columns = (slice(None), pl.ds(c * 64, 64))
                b_bf16[(0, *columns)], b_bf16[(1, *columns)] = decode_tile(
                    b_smem[slot, h * chunks + c], b_scale)
            plgpu.commit_smem()  # also: every thread has read this half's bytes
            if h == 1:  # the slot's bytes are all in registers: refill it
                pl.when(t + stages < k_steps)(lambda: issue(t + stages, slot))
            mma(0)
            mma(1)
            plgpu.wgmma_wait(0)  # the staging tiles are rewritten next
        return carry

    for t in range(min(stages, k_steps)):
        issue(t, t)
    lax.fori_loop(0, k_steps, step, 0)


def row_staging(block_m: int, width: int, dtype) -> plgpu.SMEM | None:
    """The shared memory ``store_valid_rows`` stages a partial block's rows in, when a
    row of ``width`` elements is not a whole number of TMA_SMEM_ALIGN-byte units; else
    None (rows are stored from the tile itself)."""
    row_bytes = width * jnp.dtype(dtype).itemsize
    if row_bytes % TMA_SMEM_ALIGN == 0:
        return None
    return plgpu.SMEM((block_m, TMA_SMEM_ALIGN // jnp.dtype(dtype).itemsize), dtype)


def store_valid_rows(o_smem, out_ref, e, m0, n0, rows, block_m: int, width: int,
                     staging=None) -> None:
    """Copy a [block_m, width] tile to out[e, m0:, n0:], only rows < ``rows``: whole
    when full, else row by row (the last, partial block of an expert).

    A TMA copy's shared-memory address must be TMA_SMEM_ALIGN-byte aligned (an H200
    raised "misaligned address" for 64- and 16-byte rows sent one by one): a row at
    ``r * row bytes`` is only when the row is a whole number of such units. Narrower rows
    are first copied, through registers, to ``staging`` (``row_staging``), one row per
    aligned unit. A tile that needs staging and gets none is refused at trace time."""
    if staging is None and row_staging(block_m, width, o_smem.dtype) is not None:
        raise ValueError(f"rows of {width * jnp.dtype(o_smem.dtype).itemsize} bytes are not "
                         f"{TMA_SMEM_ALIGN}-byte aligned in shared memory: pass "
                         "staging=row_staging(...)")

    @pl.when(m0 + block_m <= rows)
    def _():
        plgpu.copy_smem_to_gmem(o_smem, out_ref.at[e, pl.ds(m0, block_m), pl.ds(n0, width)])

    @pl.when(m0 + block_m > rows)
    def _():
        if staging is not None:
            staging[:, pl.ds(0, width)] = o_smem[...]
            plgpu.commit_smem()

        def store_row(r, carry):
            source = (o_smem.at[pl.ds(r, 1)] if staging is None
                      else staging.at[pl.ds(r, 1), pl.ds(0, width)])
            plgpu.copy_smem_to_gmem(source, out_ref.at[e, pl.ds(m0 + r, 1), pl.ds(n0, width)])
            return carry

        lax.fori_loop(0, rows - m0, store_row, 0)
