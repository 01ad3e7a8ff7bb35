"""Splash attention backward in one kernel for NVIDIA Hopper: dQ, dK and dV together.

dK/dV-stationary, as ``mgpu_backward``'s dkv kernel: a CTA owns one kv block at a time
and walks, for every query head of its group, the non-empty q blocks of upstream's dkv
MaskInfo in the transposed orientation (Sᵀ = K·Qᵀ, Pᵀ, dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ,
dK += dSᵀ·Q). The same step also makes that block's share of dQ, transposed so that no
operand needs a transpose: dQᵀ += Kᵀ·dSᵀ (Kᵀ stored pre-transposed, dSᵀ already in
SMEM for dK).

dQ sums over kv blocks that different CTAs own. Without atomics (the Mosaic GPU
interpreter runs neither ``atomic_add`` nor a TMA reduction), the sum is a partitioned
reduction: CTA (kv head, r) owns kv blocks r, r + P, r + 2P, ... (``partitions`` = P)
and alone writes partition r of an f32 buffer [P, Hq, D, Sq], so it can read, add and
write its own partial dQᵀ tiles in turn (the first touch of a tile writes it; the table
``first`` comes from the host, as the block tables do). A q block no kv block of a
partition touches is never written there and is left out of the sum (``touched``), which
XLA takes over the partitions after the kernel. The buffer is P·Hq·D·Sq·4 bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_interpret, mgpu_lowering
from kernels.splash_attention.block_plan import DkvPlan
from kernels.splash_attention.mgpu_backward import (
    DKV_TABLES,
    BackwardConfig,
    DkvWalk,
    _check_tiling,
    _int32,
    _mm,
    check_arguments,
    dkv_scratch,
    dkv_tables,
)
from kernels.splash_attention.mgpu_forward import (
    LOG2E,
    SMEM_LIMIT_BYTES,
    Problem,
    _tiled,
)


@dataclasses.dataclass(frozen=True)
class FusedBackwardConfig:
    """The dkv kernel's tiles (``BackwardConfig``) and the number of partitions of the
    dQ reduction: CTAs per kv head, each owning every ``partitions``-th kv block."""

    tiles: BackwardConfig = dataclasses.field(default_factory=BackwardConfig)
    partitions: int = 1

    def __post_init__(self):
        if self.partitions < 1:
            raise ValueError(f"{self.partitions=} must be at least 1")


def scratch(problem: Problem, config: FusedBackwardConfig, has_tiles: bool) -> dict:
    """The dkv kernel's buffers, Kᵀ for dQᵀ, and the f32 dQᵀ tile read, added, written."""
    tiles = config.tiles
    smem = dkv_scratch(problem, tiles, has_tiles)
    smem["kt_smem"] = _tiled((problem.head_dim_qk, tiles.block_kv), jnp.dtype(problem.dtype))
    smem["dq_smem"] = _tiled((problem.head_dim_qk, tiles.block_q), jnp.float32)
    smem["dq_barrier"] = plgpu.Barrier(num_arrivals=1)
    smem["kv_barrier"] = plgpu.Barrier(num_arrivals=4 if problem.segment_ids else 3)
    return smem


def smem_bytes(problem: Problem, config: FusedBackwardConfig, has_tiles: bool) -> int:
    return mgpu_lowering.scratch_bytes(scratch(problem, config, has_tiles))


def partial_bytes(problem: Problem, config: FusedBackwardConfig) -> int:
    """The f32 buffer of the dQ reduction's partitions."""
    return config.partitions * problem.heads_q * problem.head_dim_qk * problem.seq_q * 4


def touch_tables(plan: DkvPlan, partitions: int, group: int, q_blocks: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``first`` [plan_heads, kv_blocks, steps]: 1 where a step is its partition's first
    visit of its (query head, q block), in the order the CTA walks; ``touched``
    [plan_heads, partitions, group, q_blocks]: whether a partition visits it at all."""
    plan_heads, kv_blocks, steps = plan.q_block.shape
    first = np.zeros((plan_heads, kv_blocks, steps), np.int32)
    touched = np.zeros((plan_heads, partitions, group, q_blocks), bool)
    for p in range(plan_heads):
        for r in range(partitions):
            for j in range(r, kv_blocks, partitions):
                for u in range(plan.count[p, j]):
                    key = (plan.head_offset[p, j, u], plan.q_block[p, j, u])
                    if not touched[p, r, key[0], key[1]]:
                        touched[p, r, key[0], key[1]] = True
                        first[p, j, u] = 1
    return first, touched


def make(problem: Problem, config: FusedBackwardConfig, plan: DkvPlan, interpret: Any = None):
    """``f(q, k, v, out, lse, do[, q_seg, kv_seg]) -> (dq, dk, dv)`` on [H, S, D] arrays
    (``lse`` from the forward kernel, natural log), arguments checked before tracing."""
    tiles = config.tiles
    bq, bkv, parts = tiles.block_q, tiles.block_kv, config.partitions
    _check_tiling(problem, tiles, "dkv", "kv", plan.count.shape[1])
    kv_blocks, q_blocks = problem.seq_kv // bkv, problem.seq_q // bq
    if parts > kv_blocks:
        raise ValueError(f"{parts} partitions for {kv_blocks} kv blocks: at most one "
                         "partition per kv block")
    asked = smem_bytes(problem, config, plan.mask_function is None)
    if asked > SMEM_LIMIT_BYTES:
        raise ValueError(f"{asked:,} bytes of shared memory exceed the "
                         f"{SMEM_LIMIT_BYTES:,}-byte limit ({config}, head dims "
                         f"{problem.head_dim_qk}/{problem.head_dim_v})")
    if interpret is not None:
        mgpu_interpret.prepare_host_interpreter()
    dtype = jnp.dtype(problem.dtype)
    group = problem.heads_q // problem.heads_kv
    per_head_plan = plan.plan_heads > 1
    has_tiles = plan.mask_function is None
    seg = problem.segment_ids
    d_qk, d_v = problem.head_dim_qk, problem.head_dim_v

    def body(q_ref, qt_ref, k_ref, kt_ref, v_ref, do_ref, dot_ref, lse_ref, delta_ref,
             *refs, **smem):
        tables, refs = refs[:len(DKV_TABLES)], refs[len(DKV_TABLES):]
        first_ref, tiles_ref, *refs = refs
        if seg:
            q_seg_ref, kv_seg_ref, *refs = refs
        dq_ref, dk_ref, dv_ref = refs
        kv_head = lax.axis_index("heads")
        part = lax.axis_index("partitions")
        p_head = kv_head if per_head_plan else 0
        gmem = {"q": q_ref, "qt": qt_ref, "do": do_ref, "dot": dot_ref, "lse": lse_ref,
                "delta": delta_ref, "tiles": tiles_ref,
                **dict(zip(DKV_TABLES, tables, strict=True)),
                **({"q_seg": q_seg_ref} if seg else {})}
        walk = DkvWalk(problem, tiles, plan, gmem, smem)
        k_smem, v_smem, dq_smem = smem["k_smem"], smem["v_smem"], smem["dq_smem"]

        def kv_block_body(i, carry):
            kv_block = part + i * parts
            rows = pl.ds(kv_block * bkv, bkv)
            barrier = smem["kv_barrier"]
            plgpu.copy_gmem_to_smem(k_ref.at[kv_head, rows], k_smem, barrier)
            plgpu.copy_gmem_to_smem(kt_ref.at[kv_head, :, rows], smem["kt_smem"], barrier)
            plgpu.copy_gmem_to_smem(v_ref.at[kv_head, rows], v_smem, barrier)
            if seg:
                plgpu.copy_gmem_to_smem(kv_seg_ref.at[rows], smem["kv_seg_smem"], barrier)

            def dq_share(u, slot, head, q_start):
                """This kv block's share of dQᵀ, added to the partition's tile."""
                dq_t = _mm(smem["kt_smem"], smem["p_smem"], (d_qk, bq))  # Kᵀ·dSᵀ
                target = dq_ref.at[part, head, :, pl.ds(q_start, bq)]

                def added():
                    plgpu.copy_gmem_to_smem(target, dq_smem, smem["dq_barrier"])
                    plgpu.barrier_wait(smem["dq_barrier"])
                    return dq_t + dq_smem[...]

                dq_smem[...] = lax.cond(first_ref[p_head, kv_block, u] == 1,
                                        lambda: dq_t, added)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(dq_smem, target)
                plgpu.wait_smem_to_gmem(0)  # written before the tile is read again

            dk, dv = walk.run(kv_head, kv_block, also=dq_share)
            # The last wgmmas reading K and V have completed: their buffers stage dK, dV.
            k_smem[...] = dk.astype(dtype)
            v_smem[...] = dv.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[kv_head, rows])
            plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[kv_head, rows])
            plgpu.wait_smem_to_gmem(0)  # K and V are refilled for the next kv block
            return carry

        owned = (kv_blocks - part + parts - 1) // parts
        lax.fori_loop(0, owned, kv_block_body, 0)

    out_type = (jax.ShapeDtypeStruct((parts, problem.heads_q, d_qk, problem.seq_q),
                                     jnp.float32),
                jax.ShapeDtypeStruct((problem.heads_kv, problem.seq_kv, d_qk), dtype),
                jax.ShapeDtypeStruct((problem.heads_kv, problem.seq_kv, d_v), dtype))
    call = plgpu.kernel(
        body, out_type=out_type, grid=(problem.heads_kv, parts),
        grid_names=("heads", "partitions"),
        scratch_types=scratch(problem, config, has_tiles), interpret=interpret)
    tables, tiles_array = dkv_tables(plan, tiles, dtype)
    first, touched = touch_tables(plan, parts, group, q_blocks)
    # touched per query head: [P, Hq, Sq], each q block's flag over its rows
    heads = np.arange(problem.heads_q)
    p_of = heads // group if per_head_plan else np.zeros_like(heads)
    rows_touched = np.repeat(touched[p_of, :, heads % group].transpose(1, 0, 2), bq, axis=2)

    def backward(q, k, v, out, lse, do, q_seg=None, kv_seg=None):
        check_arguments(problem, {"q": q, "k": k, "v": v, "out": out, "lse": lse, "do": do},
                        q_seg, kv_seg)
        delta = jnp.einsum("hsd,hsd->hs", out.astype(jnp.float32), do.astype(jnp.float32))
        lse2 = jnp.where(jnp.isneginf(lse), jnp.inf, lse * LOG2E)
        dq_parts, dk, dv = call(
            q, jnp.swapaxes(q, 1, 2), k, jnp.swapaxes(k, 1, 2), v, do, jnp.swapaxes(do, 1, 2),
            lse2, delta, *tables, jnp.asarray(first), tiles_array, *_int32(q_seg, kv_seg))
        # The partitions' sum, each partition's untouched q blocks left out (never written).
        dq_t = jnp.where(jnp.asarray(rows_touched)[:, :, None, :], dq_parts, 0.0).sum(axis=0)
        return jnp.swapaxes(dq_t, 1, 2).astype(dtype), dk, dv

    return backward
