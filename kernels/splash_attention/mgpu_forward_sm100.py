"""Splash attention forward for NVIDIA Blackwell (sm_100a) in Pallas Mosaic GPU: the
fifth-generation tensor core (``tcgen05``) with its accumulators in tensor memory.

One CTA per (query head, 128-row q block): the 128 rows are the 128 lanes of tensor
memory, one per thread of the CTA's warpgroup. For its row of upstream MaskInfo's block
table (compacted by ``block_plan``, as for the Hopper kernel) the CTA walks only the
non-empty kv blocks:

1. TMA-copies the Q tile once, then K^T / V tiles (and, for a partial block without a
   mask function, its MaskInfo tile; with segment ids, the kv block's ids) into a ring
   of ``stages`` SMEM slots, refilled as each block's MMAs complete;
2. S = Q·K^T by ``tcgen05.mma`` (both operands in SMEM, K stored pre-transposed) into a
   [128, block_kv] f32 accumulator in tensor memory, read into registers (a row per
   thread), then the soft cap, the partial block's mask and the segment ids;
3. online softmax in base 2, P written to SMEM, P·V by ``tcgen05.mma`` into a second
   tensor-memory accumulator [128, Dv], read back and added to O in registers with the
   rescale (so no accumulator in tensor memory is ever rescaled in place);
4. O / l (0 for a row that sees no key), stored through SMEM by TMA.

Tensor memory holds block_kv + Dv f32 columns (of 512; at most 256 + 256). Each MMA is
waited on before its result is read, so the MMAs of a block run one after the other;
the TMA ring is the only overlap. Not done yet: the warp-specialised form (a TMA warp,
an MMA warp and softmax warpgroups, two q tiles in flight), and logsumexp for the
backward.

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

BLOCK_Q = 128  # the MMA's M with one CTA: the 128 lanes of tensor memory
LAYOUT = plgpu.Layout.TCGEN05  # a tensor-memory accumulator read into registers
ROW = LAYOUT.reduce(1)  # one value per accumulator row
COL = LAYOUT.reduce(0)  # one value per accumulator column


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """kv columns per step and the depth of the TMA ring (the q block is 128 rows)."""

    block_kv: int = 128
    stages: int = 2

    def __post_init__(self):
        if self.block_kv not in (64, 128, 256):
            raise ValueError(f"{self.block_kv=} must be 64, 128 or 256 (the MMA's N)")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")


def _tiled(shape, dtype):
    """SMEM tile in the layout TMA writes and the tensor core reads (128-byte swizzle)."""
    elems = 128 // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)),
                                                plgpu.SwizzleTransform(128)))


def scratch_types(problem: Problem, config: TuningConfig, has_tiles: bool) -> dict:
    """The kernel's shared and tensor memory by name (also what the budgets count)."""
    bkv, st, dt = config.block_kv, config.stages, jnp.dtype(problem.dtype)
    scratch = {
        "q_smem": _tiled((BLOCK_Q, problem.head_dim_qk), dt),
        "k_smem": _tiled((st, problem.head_dim_qk, bkv), dt),  # K^T ring
        "v_smem": _tiled((st, bkv, problem.head_dim_v), dt),
        "p_smem": _tiled((BLOCK_Q, bkv), dt),
        "s_tmem": plgpu.TMEM((BLOCK_Q, bkv), jnp.float32),
        "pv_tmem": plgpu.TMEM((BLOCK_Q, problem.head_dim_v), jnp.float32),
        "q_barrier": plgpu.Barrier(num_arrivals=2 if problem.segment_ids else 1),
        "kv_barriers": plgpu.Barrier(num_arrivals=3 if problem.segment_ids else 2,
                                     num_barriers=st),
        "mma_barrier": plgpu.Barrier(orders_tensor_core=True),
    }
    if problem.head_dim_v != problem.head_dim_qk:  # else O is staged in Q's buffer
        scratch["o_smem"] = _tiled((BLOCK_Q, problem.head_dim_v), dt)
    if has_tiles:
        scratch["tile_smem"] = _tiled((st, BLOCK_Q, bkv), dt)  # partial-mask tiles, 0/1
        scratch["tile_barriers"] = plgpu.Barrier(num_barriers=st)
    if problem.segment_ids:
        scratch["q_seg_smem"] = plgpu.SMEM((BLOCK_Q,), jnp.int32)
        scratch["kv_seg_smem"] = plgpu.SMEM((st, bkv), jnp.int32)
    return scratch


def smem_bytes(problem: Problem, config: TuningConfig, has_tiles: bool) -> int:
    """Shared memory of the buffers, from their shapes (tensor memory is apart)."""
    return mgpu_lowering.scratch_bytes(
        {k: v for k, v in scratch_types(problem, config, has_tiles).items()
         if not k.endswith("_tmem")})


def tmem_columns(problem: Problem, config: TuningConfig) -> int:
    """Tensor-memory columns of the two f32 accumulators (S and P·V): at most 256 + 256,
    the 512 of an SM, for every configuration and head dim allowed (the lowering
    refuses more all the same)."""
    return config.block_kv + problem.head_dim_v


def check(problem: Problem, config: TuningConfig, has_tiles: bool) -> None:
    """Refuse, naming the configuration, a problem the tiles do not divide or a
    configuration over the shared-memory budget."""
    if problem.return_lse:
        raise ValueError("the sm_100a forward returns no logsumexp (no backward for "
                         "sm_100a yet)")
    if problem.seq_q % BLOCK_Q or problem.seq_kv % config.block_kv:
        raise ValueError(f"sequence lengths ({problem.seq_q}, {problem.seq_kv}) must be "
                         f"multiples of ({BLOCK_Q}, {config.block_kv=})")
    used = smem_bytes(problem, config, has_tiles)
    if used > SMEM_LIMIT_BYTES:
        raise ValueError(f"{config}: {used} bytes of shared memory exceed the "
                         f"{SMEM_LIMIT_BYTES}-byte limit")


def make(problem: Problem, config: TuningConfig, block_plan: BlockPlan):
    """The forward kernel: ``f(q, k_t, v[, q_seg, kv_seg]) -> out`` (as the Hopper
    kernel's ``make``; lowered only on a host without a Blackwell GPU)."""
    mask_function = block_plan.mask_function
    has_tiles = mask_function is None
    check(problem, config, has_tiles)
    bkv, stages = config.block_kv, config.stages
    q_blocks = problem.seq_q // BLOCK_Q
    if block_plan.count.shape[1] != q_blocks:
        raise ValueError(f"block plan has {block_plan.count.shape[1]} q-blocks, want {q_blocks}")
    dtype = jnp.dtype(problem.dtype)
    group = problem.heads_q // problem.heads_kv
    per_head_plan = block_plan.mask_heads > 1

    def body(q_ref, kt_ref, v_ref, kv_block_ref, kind_ref, mask_block_ref, count_ref,
             tiles_ref, *refs, q_smem, k_smem, v_smem, p_smem, s_tmem, pv_tmem, q_barrier,
             kv_barriers, mma_barrier, o_smem=None, tile_smem=None, tile_barriers=None,
             q_seg_smem=None, kv_seg_smem=None):
        if problem.segment_ids:
            q_seg_ref, kv_seg_ref, *refs = refs
        (out_ref,) = refs
        head = lax.axis_index("heads")
        q_block = lax.axis_index("q_blocks")
        kv_head = head // group
        plan_head = head if per_head_plan else 0
        count = count_ref[plan_head, q_block]
        q_start = q_block * BLOCK_Q

        def issue(t, slot):
            kv_start = kv_block_ref[plan_head, q_block, t] * bkv
            barrier = kv_barriers.at[slot]
            plgpu.copy_gmem_to_smem(kt_ref.at[kv_head, :, pl.ds(kv_start, bkv)],
                                    k_smem.at[slot], barrier)
            plgpu.copy_gmem_to_smem(v_ref.at[kv_head, pl.ds(kv_start, bkv)],
                                    v_smem.at[slot], barrier)
            if problem.segment_ids:
                plgpu.copy_gmem_to_smem(kv_seg_ref.at[pl.ds(kv_start, bkv)],
                                        kv_seg_smem.at[slot], barrier)
            if has_tiles:
                mgpu_mask.load_tile(kind_ref[plan_head, q_block, t] == PARTIAL, tiles_ref,
                                    mask_block_ref[plan_head, q_block, t],
                                    tile_smem, tile_barriers, slot)

        plgpu.copy_gmem_to_smem(q_ref.at[head, pl.ds(q_start, BLOCK_Q)], q_smem, q_barrier)
        if problem.segment_ids:
            plgpu.copy_gmem_to_smem(q_seg_ref.at[pl.ds(q_start, BLOCK_Q)], q_seg_smem,
                                    q_barrier)
        for t in range(stages):
            pl.when(t < count)(functools.partial(issue, t, t))
        plgpu.barrier_wait(q_barrier)
        q_segments = (plgpu.layout_cast(q_seg_smem[...], ROW) if problem.segment_ids
                      else None)

        def mma(acc, a, b):
            """``acc = a @ b`` on the tensor core, waited for, read into registers."""
            plgpu.tcgen05_mma(acc, a, b, accumulate=False)
            plgpu.tcgen05_commit_arrive(mma_barrier)
            plgpu.barrier_wait(mma_barrier)
            result = plgpu.async_load_tmem(acc, layout=LAYOUT)
            plgpu.wait_load_tmem()
            return result

        def step(t, carry):
            o, row_max, row_sum = carry
            slot = lax.rem(t, stages)
            kind = kind_ref[plan_head, q_block, t]
            kv_start = kv_block_ref[plan_head, q_block, t] * bkv
            plgpu.barrier_wait(kv_barriers.at[slot])
            s, _ = mgpu_mask.soft_cap(mma(s_tmem, q_smem, k_smem.at[slot]), problem.soft_cap)

            def tile():
                plgpu.barrier_wait(tile_barriers.at[slot])
                return plgpu.layout_cast(tile_smem.at[slot][...], LAYOUT)

            s = mgpu_mask.partial_block(
                s, kind == PARTIAL, mask_function, tile,
                lambda: (mgpu_mask.iota((BLOCK_Q, bkv), 0, q_start, LAYOUT),
                         mgpu_mask.iota((BLOCK_Q, bkv), 1, kv_start, LAYOUT)))
            if problem.segment_ids:
                kv_ids = plgpu.layout_cast(kv_seg_smem.at[slot][...], COL)
                cols = plgpu.layout_cast(lax.broadcast_in_dim(kv_ids, s.shape, [1]), LAYOUT)
                rows = lax.broadcast_in_dim(q_segments, s.shape, [0])
                s = jnp.where(rows == cols, s, -jnp.inf)
            row_max_new = jnp.maximum(row_max, s.max(axis=1) * LOG2E)
            alpha = jnp.exp2(row_max - row_max_new)
            p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(row_max_new, s.shape, [0]))
            row_sum = row_sum * alpha + p.sum(axis=1)
            p_smem[...] = p.astype(dtype)
            plgpu.commit_smem()
            o = o * lax.broadcast_in_dim(alpha, o.shape, [0]) + mma(pv_tmem, p_smem,
                                                                    v_smem.at[slot])
            # Both MMAs reading this slot have completed: refill it.
            pl.when(t + stages < count)(lambda: issue(t + stages, slot))
            return o, row_max_new, row_sum

        zero_o = plgpu.layout_cast(jnp.zeros((BLOCK_Q, problem.head_dim_v), jnp.float32),
                                   LAYOUT)
        zero_row = plgpu.layout_cast(jnp.zeros((BLOCK_Q,), jnp.float32), ROW)
        o, _, row_sum = lax.fori_loop(0, count, step, (zero_o, zero_row + M_FLOOR, zero_row))
        seen = row_sum > 0
        inv_sum = jnp.where(seen, 1.0 / jnp.where(seen, row_sum, 1.0), 0.0)  # no key: 0
        # The last MMA reading Q has completed: its buffer stages O when the dims agree.
        out_smem = q_smem if o_smem is None else o_smem
        out_smem[...] = (o * lax.broadcast_in_dim(inv_sum, o.shape, [0])).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem, out_ref.at[head, pl.ds(q_start, BLOCK_Q)])
        plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct(
            (problem.heads_q, problem.seq_q, problem.head_dim_v), dtype),
        grid=(problem.heads_q, q_blocks), grid_names=("heads", "q_blocks"),
        scratch_types=scratch_types(problem, config, has_tiles))
    tables, tiles = plan_operands(block_plan, (BLOCK_Q, bkv), dtype)

    def forward(q, k_t, v, q_seg=None, kv_seg=None):
        extra = ()
        if problem.segment_ids:
            extra = (q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32))
        return call(q, k_t, v, *tables, tiles, *extra)

    return forward
