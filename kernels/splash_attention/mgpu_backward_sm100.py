"""Splash attention backward for NVIDIA Blackwell (sm_100a) in Pallas Mosaic GPU: dQ and
dK/dV on the fifth-generation tensor core, gradients accumulated in tensor memory.

The mathematics is ``mgpu_backward``'s (S = cap(Q·Kᵀ) masked, P = exp(S - lse),
Δ = rowsum(dO ∘ O), dP = dO·Vᵀ, dS = P ∘ (dP - Δ) ∘ cap'(Q·Kᵀ); dQ = dS·K, dK = dSᵀ·Q,
dV = Pᵀ·dO), with the same block tables, masks, segment ids and soft cap. What differs:

- every product is a ``tcgen05.mma`` into tensor memory; dQ, dK and dV accumulate there
  across the blocks a CTA walks (no register accumulator, no rescale), and are read
  back once, 64 columns at a time;
- transposed operands are transposed views of the tiles in shared memory (the MMA reads
  either major order), so K, V, Q and dO are each loaded once: no pre-transposed copy;
- ``dq``: one CTA per (query head, 128-row q block) walks the non-empty kv blocks;
  S and dP are issued together, then dQ += dS·K; ``dkv``: one CTA per (kv head,
  128-row kv block) walks every query head of its group's non-empty q blocks in the
  transposed orientation: Sᵀ and dPᵀ together, dV += Pᵀ·dO, dK += dSᵀ·Q;
- where dK and dV do not both fit tensor memory beside Sᵀ and dPᵀ (head dims 256:
  640 of 512 columns), the dkv kernel runs twice, once per gradient (``parts``).

One warpgroup per CTA, each MMA waited on before its result is read: the TMA ring is
the only overlap (not warp specialised). The Mosaic GPU interpreter runs no tcgen05 or
tensor-memory operation: these kernels are lowered on any host and run only on a
Blackwell GPU.
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
from kernels.splash_attention.block_plan import PARTIAL, BlockPlan, DkvPlan
from kernels.splash_attention.mgpu_backward import _int32, _tables, check_arguments
from kernels.splash_attention.mgpu_forward import LOG2E, SMEM_LIMIT_BYTES, Problem
from kernels.splash_attention.mgpu_forward_sm100 import (
    COL,
    LAYOUT,
    O_CHUNK,
    ROW,
    TILE_Q,
    _tiled,
)

TILE = TILE_Q  # rows a CTA owns (q rows for dq, kv rows for dkv): the lanes of tensor memory
GRADIENTS = ("dk", "dv")


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """Columns per step (kv columns for dq, q columns for dkv) and the TMA ring's depth."""

    block: int = 64
    stages: int = 2

    def __post_init__(self):
        if self.block not in (64, 128):
            raise ValueError(f"{self.block=} must be 64 or 128")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")


def dq_scratch(problem: Problem, config: BackwardConfig, has_tiles: bool) -> dict:
    bkv, st, dt = config.block, config.stages, jnp.dtype(problem.dtype)
    seg = problem.segment_ids
    scratch = {
        "q_smem": _tiled((TILE, problem.head_dim_qk), dt),  # then dQ's staging buffer
        "do_smem": _tiled((TILE, problem.head_dim_v), dt),
        "lse_smem": plgpu.SMEM((TILE,), jnp.float32),
        "delta_smem": plgpu.SMEM((TILE,), jnp.float32),
        "k_smem": _tiled((st, bkv, problem.head_dim_qk), dt),
        "v_smem": _tiled((st, bkv, problem.head_dim_v), dt),
        "ds_smem": _tiled((TILE, bkv), dt),
        "s_tmem": plgpu.TMEM((TILE, bkv), jnp.float32),
        "dp_tmem": plgpu.TMEM((TILE, bkv), jnp.float32),
        "dq_tmem": plgpu.TMEM((TILE, problem.head_dim_qk), jnp.float32),
        "row_barrier": plgpu.Barrier(num_arrivals=5 if seg else 4),
        "kv_barriers": plgpu.Barrier(num_arrivals=3 if seg else 2, num_barriers=st),
        "mma_barrier": plgpu.Barrier(orders_tensor_core=True),
    }
    if has_tiles:
        scratch["tile_smem"] = _tiled((st, TILE, bkv), dt)
        scratch["tile_barriers"] = plgpu.Barrier(num_barriers=st)
    if seg:
        scratch["q_seg_smem"] = plgpu.SMEM((TILE,), jnp.int32)
        scratch["kv_seg_smem"] = plgpu.SMEM((st, bkv), jnp.int32)
    return scratch


def dkv_scratch(problem: Problem, config: BackwardConfig, has_tiles: bool,
                parts: tuple[str, ...] = GRADIENTS) -> dict:
    bq, st, dt = config.block, config.stages, jnp.dtype(problem.dtype)
    seg = problem.segment_ids
    scratch = {
        "k_smem": _tiled((TILE, problem.head_dim_qk), dt),  # then dK's staging buffer
        "v_smem": _tiled((TILE, problem.head_dim_v), dt),  # then dV's
        "q_smem": _tiled((st, bq, problem.head_dim_qk), dt),
        "do_smem": _tiled((st, bq, problem.head_dim_v), dt),
        "lse_smem": plgpu.SMEM((st, bq), jnp.float32),
        "delta_smem": plgpu.SMEM((st, bq), jnp.float32),
        "s_tmem": plgpu.TMEM((TILE, bq), jnp.float32),
        "kv_barrier": plgpu.Barrier(num_arrivals=3 if seg else 2),
        "q_barriers": plgpu.Barrier(num_arrivals=5 if seg else 4, num_barriers=st),
        "mma_barrier": plgpu.Barrier(orders_tensor_core=True),
    }
    if "dk" in parts:
        scratch["ds_smem"] = _tiled((TILE, bq), dt)
        scratch["dp_tmem"] = plgpu.TMEM((TILE, bq), jnp.float32)
        scratch["dk_tmem"] = plgpu.TMEM((TILE, problem.head_dim_qk), jnp.float32)
    if "dv" in parts:
        scratch["pt_smem"] = _tiled((TILE, bq), dt)
        scratch["dv_tmem"] = plgpu.TMEM((TILE, problem.head_dim_v), jnp.float32)
    if has_tiles:
        scratch["tile_smem"] = _tiled((st, TILE, bq), dt)
        scratch["tile_barriers"] = plgpu.Barrier(num_barriers=st)
    if seg:
        scratch["kv_seg_smem"] = plgpu.SMEM((TILE,), jnp.int32)
        scratch["q_seg_smem"] = plgpu.SMEM((st, bq), jnp.int32)
    return scratch


def _budget(scratch: dict) -> tuple[int, int]:
    """(shared-memory bytes, tensor-memory columns) a kernel's scratch asks for."""
    shared = {k: v for k, v in scratch.items() if not k.endswith("_tmem")}
    columns = sum(v.shape[1] for k, v in scratch.items() if k.endswith("_tmem"))
    return mgpu_lowering.scratch_bytes(shared), columns


def dkv_parts(problem: Problem, config: BackwardConfig) -> tuple[tuple[str, ...], ...]:
    """The dkv launches: both gradients in one where tensor memory holds them, else one
    launch per gradient."""
    _, columns = _budget(dkv_scratch(problem, config, False))
    return (GRADIENTS,) if columns <= mgpu_lowering.TMEM_COLUMNS else (("dv",), ("dk",))


def budgets(problem: Problem, config: BackwardConfig, has_tiles: bool
            ) -> dict[str, tuple[int, int]]:
    """Each launch's (shared-memory bytes, tensor-memory columns), by name."""
    found = {"dq": _budget(dq_scratch(problem, config, has_tiles))}
    for parts in dkv_parts(problem, config):
        found["+".join(parts)] = _budget(dkv_scratch(problem, config, has_tiles, parts))
    return found


def check(problem: Problem, config: BackwardConfig, has_tiles: bool) -> None:
    """Refuse, naming the configuration, sizes the tiles do not divide or a launch over
    the shared- or tensor-memory budget."""
    if problem.seq_q % TILE or problem.seq_kv % TILE:
        raise ValueError(f"sequence lengths ({problem.seq_q}, {problem.seq_kv}) must be "
                         f"multiples of {TILE}")
    if problem.seq_q % config.block or problem.seq_kv % config.block:
        raise ValueError(f"sequence lengths ({problem.seq_q}, {problem.seq_kv}) must be "
                         f"multiples of {config.block=}")
    for dim in (problem.head_dim_qk, problem.head_dim_v):
        if dim % O_CHUNK:
            raise ValueError(f"head dims ({problem.head_dim_qk}, {problem.head_dim_v}) must "
                             f"be multiples of {O_CHUNK}")
    for launch, (smem, columns) in budgets(problem, config, has_tiles).items():
        if smem > SMEM_LIMIT_BYTES:
            raise ValueError(f"{config} ({launch} kernel): {smem} bytes of shared memory "
                             f"exceed the {SMEM_LIMIT_BYTES}-byte limit")
        if columns > mgpu_lowering.TMEM_COLUMNS:
            raise ValueError(f"{config} ({launch} kernel): {columns} tensor-memory columns "
                             f"exceed the {mgpu_lowering.TMEM_COLUMNS} of an SM")


def _product(pairs, barrier, accumulate=False) -> None:
    """Issue ``acc (+)= a @ b`` for each (acc, a, b) and wait for all of them."""
    for acc, a, b in pairs:
        plgpu.tcgen05_mma(acc, a, b, accumulate=accumulate)
    plgpu.tcgen05_commit_arrive(barrier)
    plgpu.barrier_wait(barrier)


def _read(tmem):
    value = plgpu.async_load_tmem(tmem, layout=LAYOUT)
    plgpu.wait_load_tmem()
    return value


def _store(tmem, written, out_smem, dtype) -> None:
    """A gradient from tensor memory into its staging buffer, O_CHUNK columns at a time;
    zeros where no block was walked (``written`` false: tensor memory never written)."""
    @pl.when(jnp.logical_not(written))
    def _():
        for start in range(0, tmem.shape[1], O_CHUNK):
            plgpu.async_store_tmem(tmem.at[:, pl.ds(start, O_CHUNK)],
                                   plgpu.layout_cast(jnp.zeros((TILE, O_CHUNK), jnp.float32),
                                                     LAYOUT))
        plgpu.commit_tmem()

    for start in range(0, tmem.shape[1], O_CHUNK):
        out_smem[:, pl.ds(start, O_CHUNK)] = _read(
            tmem.at[:, pl.ds(start, O_CHUNK)]).astype(dtype)


def _tile(s, slot):
    plgpu.barrier_wait(s["tile_barriers"].at[slot])
    return plgpu.layout_cast(s["tile_smem"].at[slot][...], LAYOUT)


def _columns(values, shape):
    """A per-column vector (COL layout) broadcast over the rows, in LAYOUT."""
    return plgpu.layout_cast(lax.broadcast_in_dim(values, shape, [1]), LAYOUT)


def _segments(logits, row_ids, col_ids):
    return jnp.where(lax.broadcast_in_dim(row_ids, logits.shape, [0])
                     == _columns(col_ids, logits.shape), logits, -jnp.inf)


def _setup(problem: Problem, config: BackwardConfig, plan, plan_blocks: int, blocks: int,
           kernel: str):
    """A kernel's entry checks (budgets, a plan row per block) and what its body reads:
    (mask function, has_tiles, dtype, query heads per kv head, segment ids)."""
    check(problem, config, plan.mask_function is None)
    if plan_blocks != blocks:
        raise ValueError(f"{kernel} plan has {plan_blocks} blocks, want {blocks}")
    return (plan.mask_function, plan.mask_function is None, jnp.dtype(problem.dtype),
            problem.heads_q // problem.heads_kv, problem.segment_ids)


def make_dq(problem: Problem, config: BackwardConfig, plan: BlockPlan):
    """``f(q, k, v, do, lse2, delta[, q_seg, kv_seg]) -> dq`` (lse2 = lse·log2 e, +inf on
    a row that sees no key)."""
    mask_function, has_tiles, dtype, group, seg = _setup(
        problem, config, plan, plan.count.shape[1], problem.seq_q // TILE, "dq")
    bkv, stages = config.block, config.stages
    per_head_plan = plan.mask_heads > 1

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, block_ref, kind_ref,
             mask_block_ref, count_ref, tiles_ref, *refs, **s):
        if seg:
            q_seg_ref, kv_seg_ref, *refs = refs
        (dq_ref,) = refs
        head, q_block = lax.axis_index("heads"), lax.axis_index("q_blocks")
        kv_head = head // group
        plan_head = head if per_head_plan else 0
        q_start = q_block * TILE
        count = count_ref[plan_head, q_block]
        rows = pl.ds(q_start, TILE)
        for src, dst in ((q_ref.at[head, rows], "q_smem"), (do_ref.at[head, rows], "do_smem"),
                         (lse_ref.at[head, rows], "lse_smem"),
                         (delta_ref.at[head, rows], "delta_smem"),
                         *(((q_seg_ref.at[rows], "q_seg_smem"),) if seg else ())):
            plgpu.copy_gmem_to_smem(src, s[dst], s["row_barrier"])

        def issue(t, slot):
            cols = pl.ds(block_ref[plan_head, q_block, t] * bkv, bkv)
            barrier = s["kv_barriers"].at[slot]
            plgpu.copy_gmem_to_smem(k_ref.at[kv_head, cols], s["k_smem"].at[slot], barrier)
            plgpu.copy_gmem_to_smem(v_ref.at[kv_head, cols], s["v_smem"].at[slot], barrier)
            if seg:
                plgpu.copy_gmem_to_smem(kv_seg_ref.at[cols], s["kv_seg_smem"].at[slot],
                                        barrier)
            if has_tiles:
                mgpu_mask.load_tile(kind_ref[plan_head, q_block, t] == PARTIAL, tiles_ref,
                                    mask_block_ref[plan_head, q_block, t], s["tile_smem"],
                                    s["tile_barriers"], slot)

        for t in range(stages):
            pl.when(t < count)(functools.partial(issue, t, t))
        plgpu.barrier_wait(s["row_barrier"])
        lse = plgpu.layout_cast(s["lse_smem"][...], ROW)
        delta = plgpu.layout_cast(s["delta_smem"][...], ROW)
        q_segments = plgpu.layout_cast(s["q_seg_smem"][...], ROW) if seg else None

        @pl.loop(0, count)
        def _step(t):
            slot = lax.rem(t, stages)
            kind = kind_ref[plan_head, q_block, t]
            kv_start = block_ref[plan_head, q_block, t] * bkv
            plgpu.barrier_wait(s["kv_barriers"].at[slot])
            k, v = s["k_smem"].at[slot], s["v_smem"].at[slot]
            _product(((s["s_tmem"], s["q_smem"], k.transpose((1, 0))),
                      (s["dp_tmem"], s["do_smem"], v.transpose((1, 0)))), s["mma_barrier"])
            logits, slope = mgpu_mask.soft_cap(_read(s["s_tmem"]), problem.soft_cap)
            logits = mgpu_mask.partial_block(
                logits, kind == PARTIAL, mask_function, lambda: _tile(s, slot),
                lambda: (mgpu_mask.iota((TILE, bkv), 0, q_start, LAYOUT),
                         mgpu_mask.iota((TILE, bkv), 1, kv_start, LAYOUT)))
            if seg:
                logits = _segments(logits, q_segments,
                                   plgpu.layout_cast(s["kv_seg_smem"].at[slot][...], COL))
            p = jnp.exp2(logits * LOG2E - lax.broadcast_in_dim(lse, logits.shape, [0]))
            ds = p * (_read(s["dp_tmem"]) - lax.broadcast_in_dim(delta, p.shape, [0]))
            if slope is not None:
                ds = ds * slope
            s["ds_smem"][...] = ds.astype(dtype)
            plgpu.commit_smem()
            # dQ += dS·K, waited for: dS's buffer and the slot are free after it.
            _product(((s["dq_tmem"], s["ds_smem"], k),), s["mma_barrier"],
                     accumulate=t > 0)
            pl.when(t + stages < count)(lambda: issue(t + stages, slot))

        _store(s["dq_tmem"], count > 0, s["q_smem"], dtype)  # Q is read by no pending MMA
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s["q_smem"], dq_ref.at[head, rows])
        plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct(
            (problem.heads_q, problem.seq_q, problem.head_dim_qk), dtype),
        grid=(problem.heads_q, problem.seq_q // TILE), grid_names=("heads", "q_blocks"),
        scratch_types=dq_scratch(problem, config, has_tiles))
    tables, tiles = _tables(plan, ("kv_block", "kind", "mask_block", "count"), (TILE, bkv),
                            dtype)

    def dq(q, k, v, do, lse2, delta, q_seg=None, kv_seg=None):
        check_arguments(problem, {"q": q, "k": k, "v": v, "do": do, "lse2": lse2,
                                  "delta": delta}, q_seg, kv_seg)
        return call(q, k, v, do, lse2, delta, *tables, tiles, *_int32(q_seg, kv_seg))

    return dq


def make_dkv(problem: Problem, config: BackwardConfig, plan: DkvPlan,
             parts: tuple[str, ...] = GRADIENTS):
    """``f(q, k, v, do, lse2, delta[, q_seg, kv_seg]) -> the gradients in parts`` (a
    tuple: dk, dv, or both in that order)."""
    if not parts or set(parts) - set(GRADIENTS) or tuple(sorted(parts)) != parts:
        raise ValueError(f"parts={parts}: one or both of {GRADIENTS}, in that order")
    mask_function, has_tiles, dtype, group, seg = _setup(
        problem, config, plan, plan.count.shape[1], problem.seq_kv // TILE, "dkv")
    bq, stages = config.block, config.stages
    per_head_plan = plan.plan_heads > 1
    want_dk, want_dv = "dk" in parts, "dv" in parts

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, head_ref, block_ref, kind_ref,
             mask_block_ref, count_ref, tiles_ref, *refs, **s):
        if seg:
            q_seg_ref, kv_seg_ref, *refs = refs
        kv_head, kv_block = lax.axis_index("heads"), lax.axis_index("kv_blocks")
        p_head = kv_head if per_head_plan else 0
        kv_start = kv_block * TILE
        count = count_ref[p_head, kv_block]
        rows = pl.ds(kv_start, TILE)
        plgpu.copy_gmem_to_smem(k_ref.at[kv_head, rows], s["k_smem"], s["kv_barrier"])
        plgpu.copy_gmem_to_smem(v_ref.at[kv_head, rows], s["v_smem"], s["kv_barrier"])
        if seg:
            plgpu.copy_gmem_to_smem(kv_seg_ref.at[rows], s["kv_seg_smem"], s["kv_barrier"])

        def issue(u, slot):
            head = kv_head * group + head_ref[p_head, kv_block, u]
            cols = pl.ds(block_ref[p_head, kv_block, u] * bq, bq)
            barrier = s["q_barriers"].at[slot]
            for src, dst in ((q_ref.at[head, cols], "q_smem"), (do_ref.at[head, cols], "do_smem"),
                             (lse_ref.at[head, cols], "lse_smem"),
                             (delta_ref.at[head, cols], "delta_smem"),
                             *(((q_seg_ref.at[cols], "q_seg_smem"),) if seg else ())):
                plgpu.copy_gmem_to_smem(src, s[dst].at[slot], barrier)
            if has_tiles:
                mgpu_mask.load_tile(kind_ref[p_head, kv_block, u] == PARTIAL, tiles_ref,
                                    mask_block_ref[p_head, kv_block, u], s["tile_smem"],
                                    s["tile_barriers"], slot)

        for u in range(stages):
            pl.when(u < count)(functools.partial(issue, u, u))
        plgpu.barrier_wait(s["kv_barrier"])
        kv_segments = plgpu.layout_cast(s["kv_seg_smem"][...], ROW) if seg else None

        @pl.loop(0, count)
        def _step(u):
            slot = lax.rem(u, stages)
            kind = kind_ref[p_head, kv_block, u]
            q_start = block_ref[p_head, kv_block, u] * bq
            plgpu.barrier_wait(s["q_barriers"].at[slot])
            q, do = s["q_smem"].at[slot], s["do_smem"].at[slot]
            pairs = [(s["s_tmem"], s["k_smem"], q.transpose((1, 0)))]  # Sᵀ
            if want_dk:
                pairs.append((s["dp_tmem"], s["v_smem"], do.transpose((1, 0))))  # dPᵀ
            _product(pairs, s["mma_barrier"])
            logits, slope = mgpu_mask.soft_cap(_read(s["s_tmem"]), problem.soft_cap)
            logits = mgpu_mask.partial_block(
                logits, kind == PARTIAL, mask_function, lambda: _tile(s, slot),
                lambda: (mgpu_mask.iota((TILE, bq), 1, q_start, LAYOUT),
                         mgpu_mask.iota((TILE, bq), 0, kv_start, LAYOUT)))
            if seg:
                logits = _segments(logits, kv_segments,
                                   plgpu.layout_cast(s["q_seg_smem"].at[slot][...], COL))
            lse = plgpu.layout_cast(s["lse_smem"].at[slot][...], COL)
            p = jnp.exp2(logits * LOG2E - _columns(lse, logits.shape))  # Pᵀ
            products = []
            if want_dv:
                s["pt_smem"][...] = p.astype(dtype)
                products.append((s["dv_tmem"], s["pt_smem"], do))  # dV += Pᵀ·dO
            if want_dk:
                delta = plgpu.layout_cast(s["delta_smem"].at[slot][...], COL)
                ds = p * (_read(s["dp_tmem"]) - _columns(delta, p.shape))
                if slope is not None:
                    ds = ds * slope
                s["ds_smem"][...] = ds.astype(dtype)
                products.append((s["dk_tmem"], s["ds_smem"], q))  # dK += dSᵀ·Q
            plgpu.commit_smem()
            _product(products, s["mma_barrier"], accumulate=u > 0)
            pl.when(u + stages < count)(lambda: issue(u + stages, slot))

        # No pending MMA reads K or V: their buffers stage dK and dV.
        outs = []
        if want_dk:
            _store(s["dk_tmem"], count > 0, s["k_smem"], dtype)
            outs.append(("k_smem", refs[len(outs)]))
        if want_dv:
            _store(s["dv_tmem"], count > 0, s["v_smem"], dtype)
            outs.append(("v_smem", refs[len(outs)]))
        plgpu.commit_smem()
        for buffer, out_ref in outs:
            plgpu.copy_smem_to_gmem(s[buffer], out_ref.at[kv_head, rows])
        plgpu.wait_smem_to_gmem(0)

    dims = {"dk": problem.head_dim_qk, "dv": problem.head_dim_v}
    call = plgpu.kernel(
        body, out_type=tuple(jax.ShapeDtypeStruct((problem.heads_kv, problem.seq_kv,
                                                   dims[g]), dtype) for g in parts),
        grid=(problem.heads_kv, problem.seq_kv // TILE), grid_names=("heads", "kv_blocks"),
        scratch_types=dkv_scratch(problem, config, has_tiles, parts))
    tables, tiles = _tables(plan, ("head_offset", "q_block", "kind", "mask_block", "count"),
                            (TILE, bq), dtype)

    def dkv(q, k, v, do, lse2, delta, q_seg=None, kv_seg=None):
        check_arguments(problem, {"q": q, "k": k, "v": v, "do": do, "lse2": lse2,
                                  "delta": delta}, q_seg, kv_seg)
        return call(q, k, v, do, lse2, delta, *tables, tiles, *_int32(q_seg, kv_seg))

    return dkv


def make(problem: Problem, config: BackwardConfig, dq_plan: BlockPlan, dkv_plan: DkvPlan):
    """The backward launches behind one call: ``f(q, k, v, out, lse, do[, q_seg, kv_seg])
    -> (dq, dk, dv)`` on [H, S, D] arrays (``lse`` from the forward, natural log, f32)."""
    dq_call = make_dq(problem, config, dq_plan)
    dkv_calls = [(parts, make_dkv(problem, config, dkv_plan, parts))
                 for parts in dkv_parts(problem, config)]

    def backward(q, k, v, out, lse, do, q_seg=None, kv_seg=None):
        check_arguments(problem, {"q": q, "k": k, "v": v, "out": out, "lse": lse, "do": do},
                        q_seg, kv_seg)
        delta = jnp.einsum("hsd,hsd->hs", out.astype(jnp.float32), do.astype(jnp.float32))
        # Base 2 as the kernels compute; a row that sees no key (lse = -inf) gets +inf.
        lse2 = jnp.where(jnp.isneginf(lse), jnp.inf, lse * LOG2E)
        grads = {"dq": dq_call(q, k, v, do, lse2, delta, q_seg, kv_seg)}
        for parts, call in dkv_calls:
            grads.update(zip(parts, call(q, k, v, do, lse2, delta, q_seg, kv_seg),
                             strict=True))
        return grads["dq"], grads["dk"], grads["dv"]

    return backward
