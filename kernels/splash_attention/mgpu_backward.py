"""Splash attention backward for NVIDIA Hopper in Pallas Mosaic GPU: dQ and dK/dV.

With S = cap(Q·Kᵀ) masked, P = exp(S - lse) (``lse`` from the forward kernel),
Δ = rowsum(dO ∘ O), dP = dO·Vᵀ and dS = P ∘ (dP - Δ) ∘ cap'(Q·Kᵀ):
dQ = dS·K, dK = dSᵀ·Q, dV = Pᵀ·dO. Two kernels, each one warpgroup per CTA:

- ``dq``: one CTA per (query head, q block) walks the non-empty kv blocks of upstream's
  dq MaskInfo (the forward's table): S = Q·Kᵀ and dP = dO·Vᵀ by wgmma from K^T and V^T
  tiles, dS to SMEM, dQ += dS·K by wgmma, dQ in registers;
- ``dkv``: one CTA per (kv head, kv block) walks, for every query head of its group, the
  non-empty q blocks of upstream's dkv MaskInfo, in the transposed orientation so no
  operand needs a transpose: Sᵀ = K·Qᵀ, Pᵀ to SMEM, dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ to
  SMEM, dK += dSᵀ·Q. dK and dV are summed over the group's query heads in registers
  (GQA/MQA) and written once.

Every wgmma reads both operands from SMEM in the orientation it needs: K, Kᵀ, Vᵀ (dq)
and Q, Qᵀ, dO, dOᵀ (dkv) are stored pre-transposed in global memory by the wrapper, as
the forward stores Kᵀ. This doubles those tiles' TMA traffic and SMEM against a
``transpose_ref`` operand (which the 0.10.2 interpreter cannot run); what is verified
is what is lowered. Per-row statistics (lse, Δ) and segment ids are TMA-copied as
vectors and read in the accumulator's row (``WGMMA.reduce(1)``) or column
(``WGMMA.reduce(0)``) layout by a ``layout_cast`` right after the read, which lowers as
``plgpu.load(..., layout=...)`` does. Partial blocks use the mask function on iota
(causal/local/chunked) or MaskInfo's partial tiles by TMA, as the forward.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_interpret, mgpu_lowering
from kernels.splash_attention import mgpu_mask
from kernels.splash_attention.block_plan import PARTIAL, BlockPlan, DkvPlan
from kernels.splash_attention.mgpu_forward import (
    COL,
    LOG2E,
    ROW,
    Problem,
    _tiled,
    check_segment_ids,
)

ROW_AXES = ("heads_q", "seq_q")
# The axes of every array argument of the backward entries (``_t``: transposed).
AXES = {"q": ("heads_q", "seq_q", "head_dim_qk"), "q_t": ("heads_q", "head_dim_qk", "seq_q"),
        "k": ("heads_kv", "seq_kv", "head_dim_qk"), "k_t": ("heads_kv", "head_dim_qk", "seq_kv"),
        "v": ("heads_kv", "seq_kv", "head_dim_v"), "v_t": ("heads_kv", "head_dim_v", "seq_kv"),
        "out": ("heads_q", "seq_q", "head_dim_v"), "do": ("heads_q", "seq_q", "head_dim_v"),
        "do_t": ("heads_q", "head_dim_v", "seq_q"), "lse": ROW_AXES, "lse2": ROW_AXES,
        "delta": ROW_AXES}
ROW_STATISTICS = ("lse", "lse2", "delta")  # float32; every other array: the problem's dtype


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """Tile choice of both backward kernels: the dq kernel's CTA owns ``block_q`` rows
    and steps over ``block_kv`` columns; the dkv kernel's CTA owns ``block_kv`` rows and
    steps over ``block_q`` columns. ``stages``: depth of each TMA ring."""

    block_q: int = 64
    block_kv: int = 64
    stages: int = 2

    def __post_init__(self):
        for name in ("block_q", "block_kv"):
            if getattr(self, name) not in (64, 128):
                raise ValueError(f"{name}={getattr(self, name)} must be 64 or 128")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")


def check_arguments(problem: Problem, arrays: dict[str, Any], q_seg, kv_seg) -> None:
    """Before anything is traced: a one-line error naming the first argument whose dtype
    or shape is not what ``problem`` needs, or whose segment ids are not (seq,) integers
    given exactly when the problem has segment ids."""
    for name, array in arrays.items():
        _check_array(problem, name, array)
    for name, ids, length in (("q_seg", q_seg, problem.seq_q),
                              ("kv_seg", kv_seg, problem.seq_kv)):
        if ids is None and problem.segment_ids:
            raise ValueError(f"{name}: None; needs ({length},) integers (the problem has "
                             "segment ids)")
        if ids is not None and not problem.segment_ids:
            raise ValueError(f"{name}: given; needs None (the problem has no segment ids)")
        if ids is not None:
            check_segment_ids(name, ids, length)


def _check_array(problem: Problem, name: str, array) -> None:
    if not (hasattr(array, "shape") and hasattr(array, "dtype")):
        raise TypeError(f"{name}: {type(array).__name__}; needs an array")
    dtype = jnp.dtype(array.dtype).name
    want = "float32" if name in ROW_STATISTICS else problem.dtype
    if dtype != want:
        raise ValueError(f"{name}: dtype {dtype}; needs {want}")
    axes = AXES[name]
    shape = tuple(getattr(problem, axis) for axis in axes)
    if tuple(array.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(array.shape)}; needs ({', '.join(axes)}) = "
                         f"{shape}")


def _check_tiling(problem: Problem, config: BackwardConfig, kernel: str, axis: str,
                  plan_blocks: int) -> None:
    """Sequence lengths the tiles divide, and a plan with one row per ``axis`` block."""
    bq, bkv = config.block_q, config.block_kv
    if problem.seq_q % bq or problem.seq_kv % bkv:
        raise ValueError(f"sequence lengths ({problem.seq_q}, {problem.seq_kv}) must be "
                         f"multiples of ({bq=}, {bkv=})")
    blocks = problem.seq_q // bq if axis == "q" else problem.seq_kv // bkv
    if plan_blocks != blocks:
        raise ValueError(f"{kernel} plan has {plan_blocks} {axis}-blocks, want {blocks}")


def _tables(plan, fields: tuple[str, ...], tile_shape: tuple[int, int], dtype):
    """A plan's block tables and its partial tiles (one dummy tile when a mask function
    replaces them) as device arrays."""
    tables = tuple(jnp.asarray(getattr(plan, field)) for field in fields)
    tiles = jnp.asarray(plan.partial_blocks if plan.mask_function is None
                        else np.zeros((1, *tile_shape), bool), dtype)
    return tables, tiles


def _int32(q_seg, kv_seg) -> tuple:
    return () if q_seg is None else (jnp.asarray(q_seg, jnp.int32),
                                     jnp.asarray(kv_seg, jnp.int32))


def dq_scratch(problem: Problem, config: BackwardConfig, has_tiles: bool) -> dict:
    bq, bkv, st, dt = config.block_q, config.block_kv, config.stages, jnp.dtype(problem.dtype)
    seg = problem.segment_ids
    smem = {
        "q_smem": _tiled((bq, problem.head_dim_qk), dt),  # then dQ's staging buffer
        "do_smem": _tiled((bq, problem.head_dim_v), dt),
        "lse_smem": plgpu.SMEM((bq,), jnp.float32),
        "delta_smem": plgpu.SMEM((bq,), jnp.float32),
        "k_smem": _tiled((st, bkv, problem.head_dim_qk), dt),
        "kt_smem": _tiled((st, problem.head_dim_qk, bkv), dt),
        "vt_smem": _tiled((st, problem.head_dim_v, bkv), dt),
        "ds_smem": _tiled((bq, bkv), dt),
        "row_barrier": plgpu.Barrier(num_arrivals=5 if seg else 4),
        "kv_barriers": plgpu.Barrier(num_arrivals=4 if seg else 3, num_barriers=st),
    }
    if has_tiles:
        smem["tile_smem"] = _tiled((st, bq, bkv), dt)
        smem["tile_barriers"] = plgpu.Barrier(num_arrivals=1, num_barriers=st)
    if seg:
        smem["q_seg_smem"] = plgpu.SMEM((bq,), jnp.int32)
        smem["kv_seg_smem"] = plgpu.SMEM((st, bkv), jnp.int32)
    return smem


def dkv_scratch(problem: Problem, config: BackwardConfig, has_tiles: bool) -> dict:
    bq, bkv, st, dt = config.block_q, config.block_kv, config.stages, jnp.dtype(problem.dtype)
    seg = problem.segment_ids
    smem = {
        "k_smem": _tiled((bkv, problem.head_dim_qk), dt),  # then dK's staging buffer
        "v_smem": _tiled((bkv, problem.head_dim_v), dt),  # then dV's
        "q_smem": _tiled((st, bq, problem.head_dim_qk), dt),
        "qt_smem": _tiled((st, problem.head_dim_qk, bq), dt),
        "do_smem": _tiled((st, bq, problem.head_dim_v), dt),
        "dot_smem": _tiled((st, problem.head_dim_v, bq), dt),
        "lse_smem": plgpu.SMEM((st, bq), jnp.float32),
        "delta_smem": plgpu.SMEM((st, bq), jnp.float32),
        "p_smem": _tiled((bkv, bq), dt),  # Pᵀ, then dSᵀ
        "kv_barrier": plgpu.Barrier(num_arrivals=3 if seg else 2),
        "q_barriers": plgpu.Barrier(num_arrivals=7 if seg else 6, num_barriers=st),
    }
    if has_tiles:
        smem["tile_smem"] = _tiled((st, bkv, bq), dt)
        smem["tile_barriers"] = plgpu.Barrier(num_arrivals=1, num_barriers=st)
    if seg:
        smem["kv_seg_smem"] = plgpu.SMEM((bkv,), jnp.int32)
        smem["q_seg_smem"] = plgpu.SMEM((st, bq), jnp.int32)
    return smem


def smem_bytes(problem: Problem, config: BackwardConfig, has_tiles: bool) -> dict[str, int]:
    """Shared memory each backward kernel asks for, from its buffers' shapes."""
    return {"dq": mgpu_lowering.scratch_bytes(dq_scratch(problem, config, has_tiles)),
            "dkv": mgpu_lowering.scratch_bytes(dkv_scratch(problem, config, has_tiles))}


def _zeros(shape):
    """Zeros in the accumulator's layout: a fresh accumulator is zero-initialised."""
    return pl.run_scoped(lambda acc: acc[...], plgpu.ACC(shape, jnp.float32))


def _mm(a_smem, b_smem, shape):
    def run(acc):
        plgpu.wgmma(acc, a_smem, b_smem)
        return acc[...]
    return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _tile(barriers, tiles, slot):
    """A partial block's mask tile, read once its TMA copy has landed."""
    plgpu.barrier_wait(barriers.at[slot])
    return tiles.at[slot][...]


def make_dq(problem: Problem, config: BackwardConfig, plan: BlockPlan, interpret: Any = None):
    """``f(q, k, k_t, v_t, do, lse2, delta[, q_seg, kv_seg]) -> dq`` (lse2 = lse·log2 e,
    +inf on a row that sees no key), its arguments checked before anything is traced."""
    bq, bkv, stages = config.block_q, config.block_kv, config.stages
    _check_tiling(problem, config, "dq", "q", plan.count.shape[1])
    if interpret is not None:
        mgpu_interpret.prepare_host_interpreter()
    dtype = jnp.dtype(problem.dtype)
    group = problem.heads_q // problem.heads_kv
    per_head_plan = plan.mask_heads > 1
    mask_function = plan.mask_function
    has_tiles = mask_function is None
    seg = problem.segment_ids

    def body(q_ref, k_ref, kt_ref, vt_ref, do_ref, lse_ref, delta_ref, block_ref, kind_ref,
             mask_block_ref, count_ref, tiles_ref, *refs, q_smem, do_smem, lse_smem,
             delta_smem, k_smem, kt_smem, vt_smem, ds_smem, row_barrier, kv_barriers,
             tile_smem=None, tile_barriers=None, q_seg_smem=None, kv_seg_smem=None):
        if seg:
            q_seg_ref, kv_seg_ref, *refs = refs
        (dq_ref,) = refs
        head = lax.axis_index("heads")
        q_block = lax.axis_index("q_blocks")
        kv_head = head // group
        plan_head = head if per_head_plan else 0
        q_start = q_block * bq
        count = count_ref[plan_head, q_block]
        rows = pl.ds(q_start, bq)

        plgpu.copy_gmem_to_smem(q_ref.at[head, rows], q_smem, row_barrier)
        plgpu.copy_gmem_to_smem(do_ref.at[head, rows], do_smem, row_barrier)
        plgpu.copy_gmem_to_smem(lse_ref.at[head, rows], lse_smem, row_barrier)
        plgpu.copy_gmem_to_smem(delta_ref.at[head, rows], delta_smem, row_barrier)
        if seg:
            plgpu.copy_gmem_to_smem(q_seg_ref.at[rows], q_seg_smem, row_barrier)

        def issue(t, slot):
            cols = pl.ds(block_ref[plan_head, q_block, t] * bkv, bkv)
            barrier = kv_barriers.at[slot]
            plgpu.copy_gmem_to_smem(k_ref.at[kv_head, cols], k_smem.at[slot], barrier)
            plgpu.copy_gmem_to_smem(kt_ref.at[kv_head, :, cols], kt_smem.at[slot], barrier)
            plgpu.copy_gmem_to_smem(vt_ref.at[kv_head, :, cols], vt_smem.at[slot], barrier)
            if seg:
                plgpu.copy_gmem_to_smem(kv_seg_ref.at[cols], kv_seg_smem.at[slot], barrier)
            if has_tiles:
                mgpu_mask.load_tile(kind_ref[plan_head, q_block, t] == PARTIAL, tiles_ref,
                                    mask_block_ref[plan_head, q_block, t],
                                    tile_smem, tile_barriers, slot)

        for t in range(stages):
            pl.when(t < count)(functools.partial(issue, t, t))
        plgpu.barrier_wait(row_barrier)
        lse = plgpu.layout_cast(lse_smem[...], ROW)
        delta = plgpu.layout_cast(delta_smem[...], ROW)
        q_segments = plgpu.layout_cast(q_seg_smem[...], ROW) if seg else None

        def step(t, dq):
            slot = lax.rem(t, stages)
            kind = kind_ref[plan_head, q_block, t]
            kv_start = block_ref[plan_head, q_block, t] * bkv
            plgpu.barrier_wait(kv_barriers.at[slot])
            s, slope = mgpu_mask.soft_cap(_mm(q_smem, kt_smem.at[slot], (bq, bkv)),
                                          problem.soft_cap)
            s = mgpu_mask.partial_block(
                s, kind == PARTIAL, mask_function, lambda: _tile(tile_barriers, tile_smem, slot),
                lambda: (mgpu_mask.iota((bq, bkv), 0, q_start),
                         mgpu_mask.iota((bq, bkv), 1, kv_start)))
            if seg:
                s = mgpu_mask.segments(s, q_segments,
                                       plgpu.layout_cast(kv_seg_smem.at[slot][...], COL))
            p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(lse, (bq, bkv), [0]))
            dp = _mm(do_smem, vt_smem.at[slot], (bq, bkv))
            ds = p * (dp - lax.broadcast_in_dim(delta, (bq, bkv), [0]))
            if slope is not None:
                ds = ds * slope
            ds_smem[...] = ds.astype(dtype)
            plgpu.commit_smem()
            dq = dq + _mm(ds_smem, k_smem.at[slot], (bq, problem.head_dim_qk))
            # Every wgmma reading this slot has completed (results read): refill it.
            pl.when(t + stages < count)(lambda: issue(t + stages, slot))
            return dq

        dq = lax.fori_loop(0, count, step, _zeros((bq, problem.head_dim_qk)))
        q_smem[...] = dq.astype(dtype)  # the last wgmma reading Q has completed
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[head, rows])
        plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct(
            (problem.heads_q, problem.seq_q, problem.head_dim_qk), dtype),
        grid=(problem.heads_q, problem.seq_q // bq), grid_names=("heads", "q_blocks"),
        scratch_types=dq_scratch(problem, config, has_tiles), interpret=interpret)
    tables, tiles = _tables(plan, ("kv_block", "kind", "mask_block", "count"), (bq, bkv), dtype)

    def dq(q, k, k_t, v_t, do, lse2, delta, q_seg=None, kv_seg=None):
        check_arguments(problem, {"q": q, "k": k, "k_t": k_t, "v_t": v_t, "do": do,
                                  "lse2": lse2, "delta": delta}, q_seg, kv_seg)
        return call(q, k, k_t, v_t, do, lse2, delta, *tables, tiles, *_int32(q_seg, kv_seg))

    return dq


@dataclasses.dataclass(frozen=True)
class DkvWalk:
    """The dK/dV kernel's walk of one kv block, shared with the fused backward: what it
    reads (``gmem``: the q-side arrays and the plan's tables; ``smem``: the scratch of
    ``dkv_scratch``) and the problem it walks."""

    problem: Problem
    config: BackwardConfig
    plan: DkvPlan
    gmem: dict  # q, q_t, do, do_t, lse, delta, head, block, kind, mask_block, tiles[, q_seg]
    smem: dict

    def run(self, kv_head, kv_block, also=None):
        """(dK, dV) of kv block ``kv_block`` over every query head of its group, K and V
        (and its segment ids) copied to ``smem`` on ``kv_barrier`` by the caller; after
        each step's dSᵀ is in ``p_smem``, ``also(u, slot, head, q_start)`` (the fused
        backward's dQ share)."""
        problem, plan, g, m = self.problem, self.plan, self.gmem, self.smem
        bq, bkv, stages = self.config.block_q, self.config.block_kv, self.config.stages
        dtype = jnp.dtype(problem.dtype)
        group = problem.heads_q // problem.heads_kv
        p_head = kv_head if plan.plan_heads > 1 else 0
        seg, has_tiles = problem.segment_ids, plan.mask_function is None
        kv_start = kv_block * bkv
        count = g["count"][p_head, kv_block]

        def issue(u, slot):
            head = kv_head * group + g["head"][p_head, kv_block, u]
            cols = pl.ds(g["block"][p_head, kv_block, u] * bq, bq)
            barrier = m["q_barriers"].at[slot]
            for name, view in (("q", (head, cols)), ("qt", (head, slice(None), cols)),
                               ("do", (head, cols)), ("dot", (head, slice(None), cols)),
                               ("lse", (head, cols)), ("delta", (head, cols))):
                plgpu.copy_gmem_to_smem(g[name].at[view], m[f"{name}_smem"].at[slot], barrier)
            if seg:
                plgpu.copy_gmem_to_smem(g["q_seg"].at[cols], m["q_seg_smem"].at[slot], barrier)
            if has_tiles:
                mgpu_mask.load_tile(g["kind"][p_head, kv_block, u] == PARTIAL, g["tiles"],
                                    g["mask_block"][p_head, kv_block, u],
                                    m["tile_smem"], m["tile_barriers"], slot)

        for u in range(stages):
            pl.when(u < count)(functools.partial(issue, u, u))
        plgpu.barrier_wait(m["kv_barrier"])
        kv_segments = plgpu.layout_cast(m["kv_seg_smem"][...], ROW) if seg else None
        p_smem = m["p_smem"]

        def step(u, carry):
            dk, dv = carry
            slot = lax.rem(u, stages)
            kind = g["kind"][p_head, kv_block, u]
            q_start = g["block"][p_head, kv_block, u] * bq
            plgpu.barrier_wait(m["q_barriers"].at[slot])
            s, slope = mgpu_mask.soft_cap(_mm(m["k_smem"], m["qt_smem"].at[slot], (bkv, bq)),
                                          problem.soft_cap)  # Sᵀ
            s = mgpu_mask.partial_block(
                s, kind == PARTIAL, plan.mask_function,
                lambda: _tile(m.get("tile_barriers"), m.get("tile_smem"), slot),
                lambda: (mgpu_mask.iota((bkv, bq), 1, q_start),
                         mgpu_mask.iota((bkv, bq), 0, kv_start)))
            if seg:
                s = mgpu_mask.segments(s, kv_segments,
                                       plgpu.layout_cast(m["q_seg_smem"].at[slot][...], COL))
            lse = plgpu.layout_cast(m["lse_smem"].at[slot][...], COL)
            p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(lse, (bkv, bq), [1]))  # Pᵀ
            p_smem[...] = p.astype(dtype)
            plgpu.commit_smem()
            dv = dv + _mm(p_smem, m["do_smem"].at[slot], (bkv, problem.head_dim_v))
            dp = _mm(m["v_smem"], m["dot_smem"].at[slot], (bkv, bq))  # dPᵀ
            delta = plgpu.layout_cast(m["delta_smem"].at[slot][...], COL)
            ds = p * (dp - lax.broadcast_in_dim(delta, (bkv, bq), [1]))
            if slope is not None:
                ds = ds * slope
            p_smem[...] = ds.astype(dtype)  # the wgmma reading Pᵀ has completed
            plgpu.commit_smem()
            dk = dk + _mm(p_smem, m["q_smem"].at[slot], (bkv, problem.head_dim_qk))
            if also is not None:
                also(u, slot, kv_head * group + g["head"][p_head, kv_block, u], q_start)
            pl.when(u + stages < count)(lambda: issue(u + stages, slot))
            return dk, dv

        return lax.fori_loop(0, count, step, (_zeros((bkv, problem.head_dim_qk)),
                                              _zeros((bkv, problem.head_dim_v))))


DKV_TABLES = ("head", "block", "kind", "mask_block", "count")  # DkvPlan's, as DkvWalk names them


def dkv_tables(plan: DkvPlan, config: BackwardConfig, dtype):
    """The dkv plan's tables (``DKV_TABLES``' order) and partial tiles as device arrays."""
    return _tables(plan, ("head_offset", "q_block", "kind", "mask_block", "count"),
                   (config.block_kv, config.block_q), dtype)


def make_dkv(problem: Problem, config: BackwardConfig, plan: DkvPlan, interpret: Any = None):
    """``f(q, q_t, k, v, do, do_t, lse2, delta[, q_seg, kv_seg]) -> (dk, dv)``, its
    arguments checked before anything is traced."""
    bkv = config.block_kv
    _check_tiling(problem, config, "dkv", "kv", plan.count.shape[1])
    if interpret is not None:
        mgpu_interpret.prepare_host_interpreter()
    dtype = jnp.dtype(problem.dtype)
    seg = problem.segment_ids

    def body(q_ref, qt_ref, k_ref, v_ref, do_ref, dot_ref, lse_ref, delta_ref, *refs, **smem):
        tables, refs = refs[:len(DKV_TABLES) + 1], refs[len(DKV_TABLES) + 1:]
        if seg:
            q_seg_ref, kv_seg_ref, *refs = refs
        dk_ref, dv_ref = refs
        kv_head = lax.axis_index("heads")
        kv_block = lax.axis_index("kv_blocks")
        rows = pl.ds(kv_block * bkv, bkv)
        k_smem, v_smem = smem["k_smem"], smem["v_smem"]
        plgpu.copy_gmem_to_smem(k_ref.at[kv_head, rows], k_smem, smem["kv_barrier"])
        plgpu.copy_gmem_to_smem(v_ref.at[kv_head, rows], v_smem, smem["kv_barrier"])
        if seg:
            plgpu.copy_gmem_to_smem(kv_seg_ref.at[rows], smem["kv_seg_smem"],
                                    smem["kv_barrier"])
        gmem = {"q": q_ref, "qt": qt_ref, "do": do_ref, "dot": dot_ref, "lse": lse_ref,
                "delta": delta_ref, **dict(zip((*DKV_TABLES, "tiles"), tables, strict=True)),
                **({"q_seg": q_seg_ref} if seg else {})}
        dk, dv = DkvWalk(problem, config, plan, gmem, smem).run(kv_head, kv_block)
        # The last wgmmas reading K and V have completed: their buffers stage dK, dV.
        k_smem[...] = dk.astype(dtype)
        v_smem[...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[kv_head, rows])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[kv_head, rows])
        plgpu.wait_smem_to_gmem(0)

    out_type = (jax.ShapeDtypeStruct((problem.heads_kv, problem.seq_kv, problem.head_dim_qk),
                                     dtype),
                jax.ShapeDtypeStruct((problem.heads_kv, problem.seq_kv, problem.head_dim_v),
                                     dtype))
    call = plgpu.kernel(
        body, out_type=out_type, grid=(problem.heads_kv, problem.seq_kv // bkv),
        grid_names=("heads", "kv_blocks"),
        scratch_types=dkv_scratch(problem, config, plan.mask_function is None),
        interpret=interpret)
    tables, tiles = dkv_tables(plan, config, dtype)

    def dkv(q, q_t, k, v, do, do_t, lse2, delta, q_seg=None, kv_seg=None):
        check_arguments(problem, {"q": q, "q_t": q_t, "k": k, "v": v, "do": do, "do_t": do_t,
                                  "lse2": lse2, "delta": delta}, q_seg, kv_seg)
        return call(q, q_t, k, v, do, do_t, lse2, delta, *tables, tiles,
                    *_int32(q_seg, kv_seg))

    return dkv


def make(problem: Problem, config: BackwardConfig, dq_plan: BlockPlan, dkv_plan: DkvPlan,
         interpret: Any = None):
    """Both kernels behind one call: ``f(q, k, v, out, lse, do[, q_seg, kv_seg]) ->
    (dq, dk, dv)`` on [H, S, D] arrays (``lse`` from the forward kernel, natural log, f32),
    its arguments checked before anything is traced.

    ``interpret``: ``InterpretGPUParams`` to run in the Mosaic GPU interpreter, ``None``
    for the real kernels.
    """
    dq_call = make_dq(problem, config, dq_plan, interpret)
    dkv_call = make_dkv(problem, config, dkv_plan, interpret)

    def backward(q, k, v, out, lse, do, q_seg=None, kv_seg=None):
        check_arguments(problem, {"q": q, "k": k, "v": v, "out": out, "lse": lse, "do": do},
                        q_seg, kv_seg)
        delta = jnp.einsum("hsd,hsd->hs", out.astype(jnp.float32), do.astype(jnp.float32))
        # Base 2 as the kernels compute; a row that sees no key (lse = -inf) gets +inf,
        # so its P = exp2(-inf or finite - inf) = 0 rather than NaN.
        lse2 = jnp.where(jnp.isneginf(lse), jnp.inf, lse * LOG2E)
        dq = dq_call(q, k, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), do, lse2, delta,
                     q_seg, kv_seg)
        dk, dv = dkv_call(q, jnp.swapaxes(q, 1, 2), k, v, do, jnp.swapaxes(do, 1, 2), lse2,
                          delta, q_seg, kv_seg)
        return dq, dk, dv

    return backward
