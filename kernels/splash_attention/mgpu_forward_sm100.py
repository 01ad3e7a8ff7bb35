"""Splash attention forward for NVIDIA Blackwell (sm_100a) in Pallas Mosaic GPU: the
fifth-generation tensor core (``tcgen05``) with its accumulators in tensor memory, warp
specialised.

One CTA per (query head, q block of ``q_tiles`` × 128 rows); each 128-row q tile is the
128 lanes of tensor memory, owned by one softmax warpgroup, so ``q_tiles = 2`` keeps two
tiles in flight: while one warpgroup runs its softmax, the tensor core works on the
other's MMAs. A further producer warpgroup splits into a TMA warp and an MMA warp. For
the q block's row of upstream MaskInfo's block table (compacted by ``block_plan``, as
for the Hopper kernel) the CTA walks only the non-empty kv blocks:

1. the TMA warp copies the Q tiles once, then K^T / V tiles (and, for a partial block
   without a mask function, its MaskInfo tile; with segment ids, the kv block's ids)
   into a ring of ``stages`` SMEM slots, refilling a slot when the MMAs reading it are
   done (``kv_consumed``, arrived on by the tensor core);
2. the MMA warp issues, per kv block, S = Q·K^T for each tile (both operands in SMEM,
   K stored pre-transposed) into that tile's [128, block_kv] f32 tensor memory, and
   then, as each tile's P is ready, O += P·V into the tile's [128, Dv] f32 accumulator
   in tensor memory;
3. each softmax warpgroup reads its S (a row per thread), applies the soft cap, the
   partial block's mask and the segment ids, runs the online softmax in base 2, rescales
   its O in tensor memory (64 columns at a time, once the previous P·V is complete) and
   writes P to SMEM;
4. at the end O / l (0 for a row that sees no key) and optionally logsumexp, stored
   through SMEM by TMA.

Tensor memory holds q_tiles × (block_kv + Dv) f32 columns, of 512: two tiles fit for
Dv <= 128 at block_kv <= 128, one otherwise (the configuration is refused naming its
columns). The MMA warp issues a tile's next S only after its P·V, so each tile's softmax
and MMAs alternate; the two tiles overlap each other. Not done: S for the next block
issued ahead of P·V (FA4's order; it needs a deeper ring), and a Blackwell backward.

The Mosaic GPU interpreter runs no tcgen05 or tensor-memory operation (jax 0.10.2 and
0.11.2): this kernel is lowered on any host and runs only on a Blackwell GPU.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_lowering
from kernels.splash_attention import mgpu_mask
from kernels.splash_attention.block_plan import PARTIAL, BlockPlan
from kernels.splash_attention.mgpu_forward import (
    LOG2E,
    M_FLOOR,
    SMEM_LIMIT_BYTES,  # sm_100's opt-in dynamic shared memory per block is Hopper's
    Problem,
    plan_operands,
)

TILE_Q = 128  # rows per q tile: the MMA's M with one CTA, the 128 lanes of tensor memory
O_CHUNK = 64  # O columns per tensor-memory round trip (rescale, final store)
LAYOUT = plgpu.Layout.TCGEN05  # a tensor-memory accumulator read into registers
ROW = LAYOUT.reduce(1)  # one value per accumulator row
COL = LAYOUT.reduce(0)  # one value per accumulator column
TMA_WARP, MMA_WARP = 0, 1


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """kv columns per step, the depth of the TMA ring, and q tiles in flight (each a
    softmax warpgroup of 128 rows)."""

    block_kv: int = 128
    stages: int = 2
    q_tiles: int = 2

    def __post_init__(self):
        if self.block_kv not in (64, 128, 256):
            raise ValueError(f"{self.block_kv=} must be 64, 128 or 256 (the MMA's N)")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")
        if self.q_tiles not in (1, 2):
            raise ValueError(f"{self.q_tiles=} must be 1 or 2 (softmax warpgroups)")

    @property
    def block_q(self) -> int:
        return self.q_tiles * TILE_Q


def _tiled(shape, dtype):
    """SMEM tile in the layout TMA writes and the tensor core reads (128-byte swizzle)."""
    elems = 128 // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)),
                                                plgpu.SwizzleTransform(128)))


def scratch_types(problem: Problem, config: TuningConfig, has_tiles: bool) -> dict:
    """The kernel's shared and tensor memory by name (also what the budgets count)."""
    bkv, st, nq, dt = config.block_kv, config.stages, config.q_tiles, jnp.dtype(problem.dtype)
    per_tile = {"num_barriers": nq, "orders_tensor_core": True}
    scratch = {
        "q_smem": _tiled((nq, TILE_Q, problem.head_dim_qk), dt),
        "k_smem": _tiled((st, problem.head_dim_qk, bkv), dt),  # K^T ring
        "v_smem": _tiled((st, bkv, problem.head_dim_v), dt),
        "p_smem": _tiled((nq, TILE_Q, bkv), dt),
        "s_tmem": plgpu.TMEM((TILE_Q, nq * bkv), jnp.float32),
        "o_tmem": plgpu.TMEM((TILE_Q, nq * problem.head_dim_v), jnp.float32),
        "q_loaded": plgpu.Barrier(num_arrivals=nq * (2 if problem.segment_ids else 1)),
        "kv_loaded": plgpu.Barrier(num_arrivals=3 if problem.segment_ids else 2,
                                   num_barriers=st),
        "kv_consumed": plgpu.Barrier(num_barriers=st, orders_tensor_core=True),
        "s_ready": plgpu.Barrier(**per_tile),  # the tensor core wrote S
        "s_read": plgpu.Barrier(**per_tile),  # the softmax read S: the next may be issued
        "p_ready": plgpu.Barrier(**per_tile),  # P in SMEM, O rescaled
        "o_ready": plgpu.Barrier(**per_tile),  # the tensor core added P·V to O
    }
    if problem.head_dim_v != problem.head_dim_qk:  # else O is staged in Q's buffer
        scratch["o_smem"] = _tiled((nq, TILE_Q, problem.head_dim_v), dt)
    if has_tiles:
        scratch["tile_smem"] = _tiled((st, nq, TILE_Q, bkv), dt)  # partial-mask tiles, 0/1
        scratch["tile_barriers"] = plgpu.Barrier(num_barriers=st)
    if problem.segment_ids:
        scratch["q_seg_smem"] = plgpu.SMEM((nq, TILE_Q), jnp.int32)
        scratch["kv_seg_smem"] = plgpu.SMEM((st, bkv), jnp.int32)
    if problem.return_lse:
        scratch["lse_smem"] = plgpu.SMEM((nq, TILE_Q), jnp.float32)
    return scratch


def smem_bytes(problem: Problem, config: TuningConfig, has_tiles: bool) -> int:
    """Shared memory of the buffers, from their shapes (tensor memory is apart)."""
    return mgpu_lowering.scratch_bytes(
        {k: v for k, v in scratch_types(problem, config, has_tiles).items()
         if not k.endswith("_tmem")})


def tmem_columns(problem: Problem, config: TuningConfig) -> int:
    """Tensor-memory columns of the f32 accumulators: S and O per q tile."""
    return config.q_tiles * (config.block_kv + problem.head_dim_v)


def check(problem: Problem, config: TuningConfig, has_tiles: bool) -> None:
    """Refuse, naming the configuration, a problem the tiles do not divide or a
    configuration over the shared- or tensor-memory budget."""
    if problem.seq_q % config.block_q or problem.seq_kv % config.block_kv:
        raise ValueError(f"sequence lengths ({problem.seq_q}, {problem.seq_kv}) must be "
                         f"multiples of ({config.block_q=}, {config.block_kv=})")
    if problem.head_dim_v % O_CHUNK:
        raise ValueError(f"head_dim_v={problem.head_dim_v} must be a multiple of {O_CHUNK}")
    used = smem_bytes(problem, config, has_tiles)
    if used > SMEM_LIMIT_BYTES:
        raise ValueError(f"{config}: {used} bytes of shared memory exceed the "
                         f"{SMEM_LIMIT_BYTES}-byte limit")
    columns = tmem_columns(problem, config)
    if columns > mgpu_lowering.TMEM_COLUMNS:
        raise ValueError(f"{config}: {columns} tensor-memory columns exceed the "
                         f"{mgpu_lowering.TMEM_COLUMNS} of an SM")


def make(problem: Problem, config: TuningConfig, block_plan: BlockPlan):
    """The forward kernel: ``f(q, k_t, v[, q_seg, kv_seg]) -> out[, lse]`` (as the Hopper
    kernel's ``make``; lowered only on a host without a Blackwell GPU)."""
    mask_function = block_plan.mask_function
    has_tiles = mask_function is None
    check(problem, config, has_tiles)
    bkv, stages, nq, bq = config.block_kv, config.stages, config.q_tiles, config.block_q
    dv = problem.head_dim_v
    q_blocks = problem.seq_q // bq
    if block_plan.count.shape[1] != q_blocks:
        raise ValueError(f"block plan has {block_plan.count.shape[1]} q-blocks, want {q_blocks}")
    dtype = jnp.dtype(problem.dtype)
    group = problem.heads_q // problem.heads_kv
    per_head_plan = block_plan.mask_heads > 1

    def body(q_ref, kt_ref, v_ref, kv_block_ref, kind_ref, mask_block_ref, count_ref,
             tiles_ref, *refs, **s):
        if problem.segment_ids:
            q_seg_ref, kv_seg_ref, *refs = refs
        out_ref, *refs = refs
        head, q_block = lax.axis_index("heads"), lax.axis_index("q_blocks")
        kv_head = head // group
        plan_head = head if per_head_plan else 0
        count = count_ref[plan_head, q_block]

        def s_cols(w):
            return s["s_tmem"].at[:, pl.ds(w * bkv, bkv)]

        def o_cols(w, start=0, width=dv):
            return s["o_tmem"].at[:, pl.ds(w * dv + start, width)]

        def load_kv(t):
            slot = lax.rem(t, stages)
            kv_start = kv_block_ref[plan_head, q_block, t] * bkv
            loaded = s["kv_loaded"].at[slot]
            plgpu.copy_gmem_to_smem(kt_ref.at[kv_head, :, pl.ds(kv_start, bkv)],
                                    s["k_smem"].at[slot], loaded)
            plgpu.copy_gmem_to_smem(v_ref.at[kv_head, pl.ds(kv_start, bkv)],
                                    s["v_smem"].at[slot], loaded)
            if problem.segment_ids:
                plgpu.copy_gmem_to_smem(kv_seg_ref.at[pl.ds(kv_start, bkv)],
                                        s["kv_seg_smem"].at[slot], loaded)
            if has_tiles:
                mgpu_mask.load_tile(kind_ref[plan_head, q_block, t] == PARTIAL, tiles_ref,
                                    mask_block_ref[plan_head, q_block, t], s["tile_smem"],
                                    s["tile_barriers"], slot)

        def producer():
            @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
            def _per_warp():
                warp = lax.axis_index("warp")

                @pl.when(warp == TMA_WARP)
                def _load():
                    for w in range(nq):
                        rows = pl.ds(q_block * bq + w * TILE_Q, TILE_Q)
                        plgpu.copy_gmem_to_smem(q_ref.at[head, rows], s["q_smem"].at[w],
                                                s["q_loaded"])
                        if problem.segment_ids:
                            plgpu.copy_gmem_to_smem(q_seg_ref.at[rows], s["q_seg_smem"].at[w],
                                                    s["q_loaded"])

                    @pl.loop(0, count)
                    def _(t):
                        @pl.when(t >= stages)  # the MMAs of step t - stages are done
                        def _():
                            plgpu.barrier_wait(s["kv_consumed"].at[lax.rem(t, stages)])

                        load_kv(t)

                @pl.when(warp == MMA_WARP)
                def _multiply():
                    plgpu.barrier_wait(s["q_loaded"])

                    @pl.loop(0, count)
                    def _(t):
                        slot = lax.rem(t, stages)
                        plgpu.barrier_wait(s["kv_loaded"].at[slot])
                        for w in range(nq):
                            @pl.when(t > 0)  # the softmax has read the last S
                            def _(w=w):
                                plgpu.barrier_wait(s["s_read"].at[w])

                            plgpu.tcgen05_mma(s_cols(w), s["q_smem"].at[w],
                                              s["k_smem"].at[slot], accumulate=False)
                            plgpu.tcgen05_commit_arrive(s["s_ready"].at[w])
                        for w in range(nq):
                            plgpu.barrier_wait(s["p_ready"].at[w])
                            plgpu.tcgen05_mma(o_cols(w), s["p_smem"].at[w],
                                              s["v_smem"].at[slot], accumulate=t > 0)
                            plgpu.tcgen05_commit_arrive(s["o_ready"].at[w])
                        plgpu.tcgen05_commit_arrive(s["kv_consumed"].at[slot])

        def softmax(w):
            """Warpgroup w: its q tile's online softmax; O stays in tensor memory."""
            q_start = q_block * bq + w * TILE_Q
            q_segments = None
            if problem.segment_ids:
                plgpu.barrier_wait(s["q_loaded"])
                q_segments = plgpu.layout_cast(s["q_seg_smem"].at[w][...], ROW)

            def step(t, carry):
                row_max, row_sum = carry
                slot = lax.rem(t, stages)
                kind = kind_ref[plan_head, q_block, t]
                kv_start = kv_block_ref[plan_head, q_block, t] * bkv
                if problem.segment_ids or has_tiles:
                    plgpu.barrier_wait(s["kv_loaded"].at[slot])
                plgpu.barrier_wait(s["s_ready"].at[w])
                logits = plgpu.async_load_tmem(s_cols(w), layout=LAYOUT)
                plgpu.wait_load_tmem()
                plgpu.barrier_arrive(s["s_read"].at[w])
                logits, _ = mgpu_mask.soft_cap(logits, problem.soft_cap)

                def tile():
                    plgpu.barrier_wait(s["tile_barriers"].at[slot])
                    return plgpu.layout_cast(s["tile_smem"].at[slot, w][...], LAYOUT)

                logits = mgpu_mask.partial_block(
                    logits, kind == PARTIAL, mask_function, tile,
                    lambda: (mgpu_mask.iota((TILE_Q, bkv), 0, q_start, LAYOUT),
                             mgpu_mask.iota((TILE_Q, bkv), 1, kv_start, LAYOUT)))
                if problem.segment_ids:
                    kv_ids = plgpu.layout_cast(s["kv_seg_smem"].at[slot][...], COL)
                    cols = plgpu.layout_cast(
                        lax.broadcast_in_dim(kv_ids, logits.shape, [1]), LAYOUT)
                    rows = lax.broadcast_in_dim(q_segments, logits.shape, [0])
                    logits = jnp.where(rows == cols, logits, -jnp.inf)
                row_max_new = jnp.maximum(row_max, logits.max(axis=1) * LOG2E)
                alpha = jnp.exp2(row_max - row_max_new)
                p = jnp.exp2(logits * LOG2E
                             - lax.broadcast_in_dim(row_max_new, logits.shape, [0]))
                row_sum = row_sum * alpha + p.sum(axis=1)

                @pl.when(t > 0)  # the last P·V is in O, and P's buffer is free
                def _():
                    plgpu.barrier_wait(s["o_ready"].at[w])
                    scale_o(w, alpha)

                s["p_smem"].at[w][...] = p.astype(dtype)
                plgpu.commit_smem()
                plgpu.barrier_arrive(s["p_ready"].at[w])
                return row_max_new, row_sum

            zero_row = plgpu.layout_cast(jnp.zeros((TILE_Q,), jnp.float32), ROW)
            row_max, row_sum = lax.fori_loop(0, count, step, (zero_row + M_FLOOR, zero_row))

            @pl.when(count > 0)
            def _():
                plgpu.barrier_wait(s["o_ready"].at[w])

            seen = row_sum > 0
            safe_sum = jnp.where(seen, row_sum, 1.0)
            inv_sum = jnp.where(seen, 1.0 / safe_sum, 0.0)  # a row that sees no key: 0
            # The last MMA reading Q has completed: its buffer stages O when the dims agree.
            out_smem = s.get("o_smem", s["q_smem"]).at[w]
            for start in range(0, dv, O_CHUNK):
                o = plgpu.async_load_tmem(o_cols(w, start, O_CHUNK), layout=LAYOUT)
                plgpu.wait_load_tmem()
                # A row that sees no key (no block at all: O never written) stores 0.
                o = jnp.where(lax.broadcast_in_dim(seen, o.shape, [0]), o, 0.0)
                out_smem[:, pl.ds(start, O_CHUNK)] = (
                    o * lax.broadcast_in_dim(inv_sum, o.shape, [0])).astype(dtype)
            if problem.return_lse:
                lse = (row_max + jnp.log2(safe_sum)) / LOG2E
                s["lse_smem"].at[w][...] = jnp.where(seen, lse, -jnp.inf)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_smem, out_ref.at[head, pl.ds(q_start, TILE_Q)])
            if problem.return_lse:
                plgpu.copy_smem_to_gmem(s["lse_smem"].at[w],
                                        refs[0].at[head, pl.ds(q_start, TILE_Q)])
            plgpu.wait_smem_to_gmem(0)

        def scale_o(w, alpha):
            """O *= alpha per row, in tensor memory, O_CHUNK columns at a time."""
            for start in range(0, dv, O_CHUNK):
                o = plgpu.async_load_tmem(o_cols(w, start, O_CHUNK), layout=LAYOUT)
                plgpu.wait_load_tmem()
                plgpu.async_store_tmem(o_cols(w, start, O_CHUNK),
                                       o * lax.broadcast_in_dim(alpha, o.shape, [0]))
            plgpu.commit_tmem()

        wg = lax.axis_index("wg")
        pl.when(wg == nq)(producer)
        for w in range(nq):
            pl.when(wg == w)(functools.partial(softmax, w))

    out_type = [jax.ShapeDtypeStruct((problem.heads_q, problem.seq_q, dv), dtype)]
    if problem.return_lse:
        out_type.append(jax.ShapeDtypeStruct((problem.heads_q, problem.seq_q), jnp.float32))
    call = plgpu.kernel(
        body, out_type=tuple(out_type), grid=(problem.heads_q, q_blocks),
        grid_names=("heads", "q_blocks"), num_threads=nq + 1, thread_name="wg",
        scratch_types=scratch_types(problem, config, has_tiles))
    tables, tiles = plan_operands(block_plan, (bq, bkv), dtype)
    tiles = tiles.reshape(tiles.shape[0], nq, TILE_Q, bkv)  # each warpgroup's rows

    def forward(q, k_t, v, q_seg=None, kv_seg=None):
        extra = ()
        if problem.segment_ids:
            extra = (q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32))
        outs = call(q, k_t, v, *tables, tiles, *extra)
        return outs if problem.return_lse else outs[0]

    return forward
