"""Splash attention forward for NVIDIA Hopper in Pallas Mosaic GPU (``plgpu.kernel``).

One CTA per (query head, q-block). With one compute warpgroup (the default) that
warpgroup issues the TMA copies and computes; with two (``compute_wgs=2``, FA3-style)
two consumer warpgroups of 64 rows each share the kv ring that a third, producer
warpgroup fills, handing slots back through "consumed" barriers. For its row of upstream
MaskInfo's block table (compacted by ``block_plan``) the CTA walks only the non-empty kv
blocks:

1. TMA-copies the Q tile once, then K^T / V tiles (and, for a partial block, its mask
   tile) into a ring of ``stages`` SMEM slots, ``stages - 1`` blocks ahead;
2. S = Q·K^T with wgmma (both operands in SMEM: K is stored pre-transposed, [D, S], in
   global memory, so no transpose is needed anywhere), optional soft cap
   ``cap·tanh(S/cap)``, then the mask of a partial block (from iota for causal/local
   masks, else from the MaskInfo tile) and the segment ids;
3. online softmax in base 2 on the f32 accumulator, P written to SMEM, O += P·V with
   wgmma, O and the row statistics carried in registers;
4. O / l (0 for a row that sees no key) and optionally logsumexp, stored through SMEM.

Segment ids are TMA-copied as int32 vectors (the q block's once, each kv block's into
the ring) and read in the accumulator's row (``WGMMA.reduce(1)``) or column
(``WGMMA.reduce(0)``) layout by a ``layout_cast`` right after the SMEM read: the Mosaic
GPU lowering then loads them in that layout, exactly as ``plgpu.load(..., layout=...)``
(which the 0.10.2 interpreter cannot run) would.

Constraints: f16/bf16; Dqk, Dv multiples of 64 up to 256; sequence lengths multiples
of the block sizes; no 1/sqrt(D) scaling inside (as upstream). What is verified is
what is lowered: ``make`` builds the same kernel with ``interpret=`` the Mosaic GPU
interpreter's params or ``None`` for the real lowering.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_interpret
from kernels.splash_attention import mgpu_mask
from kernels.splash_attention.block_plan import PARTIAL, BlockPlan

LOG2E = math.log2(math.e)
# A finite floor for the running max (base-2 units): a row whose visible keys have not
# appeared yet keeps m = floor and p = exp2(-inf - floor) = 0, so no NaN from
# (-inf) - (-inf) arises. Upstream's mask value (DEFAULT_MASK_VALUE) is the same number.
M_FLOOR = -0.7 * float(np.finfo(np.float32).max)
SMEM_LIMIT_BYTES = 232_448  # Hopper's opt-in dynamic shared memory per block (227 KiB)
DTYPES = ("float16", "bfloat16")
ROW = plgpu.Layout.WGMMA.reduce(1)  # one value per accumulator row
COL = plgpu.Layout.WGMMA.reduce(0)  # one value per accumulator column


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Tile choice: rows of Q per CTA, kv columns per step, depth of the TMA ring, and
    compute warpgroups per CTA: 1 (it also issues the TMA copies) or 2 (FA3-style: two
    consumer warpgroups of 64 rows each and a producer warpgroup that only issues TMA;
    block_q must then be 128).

    Both forms are lowered for sm_90a and verified in the interpreter; the interpreter
    runs the three warpgroups of the two-warpgroup form on separate XLA CPU workers
    (see ``mgpu_interpret.start_host_backend``)."""

    block_q: int = 64
    block_kv: int = 64
    stages: int = 2
    compute_wgs: int = 1

    def __post_init__(self):
        if self.block_q not in (64, 128):
            raise ValueError(f"{self.block_q=} must be 64 or 128 (one warpgroup's rows)")
        if self.compute_wgs not in (1, 2):
            raise ValueError(f"{self.compute_wgs=} must be 1 or 2")
        if self.compute_wgs == 2 and self.block_q != 128:
            raise ValueError(f"{self.compute_wgs=} needs block_q=128 (64 rows each), got "
                             f"{self.block_q=}")
        if self.block_kv % 64 or not 64 <= self.block_kv <= 256:
            raise ValueError(f"{self.block_kv=} must be a multiple of 64 in [64, 256]")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")


@dataclasses.dataclass(frozen=True)
class Switches:
    """Parts of the computation an ablation switches off; every part on is the verified
    kernel. Off, a part computes a wrong result on purpose (``ablations``)."""

    mask_evaluation: bool = True  # off: a partial block computed as a full one, no tile read
    rescaling: bool = True  # off: O and the row sum never rescaled as the row max grows


ALL_ON = Switches()


@dataclasses.dataclass(frozen=True)
class Problem:
    """The static facts of one call: shapes, dtype and options."""

    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim_qk: int
    head_dim_v: int
    dtype: str
    soft_cap: float | None = None
    segment_ids: bool = False
    return_lse: bool = False

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.dtype=} must be one of {DTYPES}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"{self.heads_q=} must be a multiple of {self.heads_kv=}")
        for name in ("head_dim_qk", "head_dim_v"):
            d = getattr(self, name)
            if d % 64 or not 64 <= d <= 256:
                raise ValueError(f"{name}={d} must be a multiple of 64 in [64, 256]")
        if self.soft_cap is not None and not self.soft_cap > 0:
            raise ValueError(f"{self.soft_cap=} must be positive")


def _tiled(shape, dtype):
    """SMEM tile in the layout TMA writes and wgmma reads (128-byte swizzle)."""
    swizzle = 128
    elems = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)),
                                                plgpu.SwizzleTransform(swizzle)))


def scratch_types(problem: Problem, config: TuningConfig, has_tiles: bool) -> dict:
    """The kernel's shared memory by name (also what the budget counts)."""
    bkv, st, dt = config.block_kv, config.stages, jnp.dtype(problem.dtype)
    wgs = config.compute_wgs
    rows = config.block_q // wgs  # rows of each compute warpgroup
    smem = {
        "q_smem": _tiled((wgs, rows, problem.head_dim_qk), dt),
        "k_smem": _tiled((st, problem.head_dim_qk, bkv), dt),  # K^T ring
        "v_smem": _tiled((st, bkv, problem.head_dim_v), dt),
        "p_smem": _tiled((wgs, rows, bkv), dt),
        "q_barrier": plgpu.Barrier(num_arrivals=2 if problem.segment_ids else 1,
                                   num_barriers=wgs),
        "kv_barriers": plgpu.Barrier(num_arrivals=3 if problem.segment_ids else 2,
                                     num_barriers=st),
    }
    if wgs > 1:  # the consumers free a ring slot for the producer
        smem["consumed_barriers"] = plgpu.Barrier(num_arrivals=wgs, num_barriers=st)
    if problem.head_dim_v != problem.head_dim_qk:  # else O is staged in Q's buffer
        smem["o_smem"] = _tiled((wgs, rows, problem.head_dim_v), dt)
    if has_tiles:
        smem["tile_smem"] = _tiled((st, wgs, rows, bkv), dt)  # partial-mask tiles, 0/1
        smem["tile_barriers"] = plgpu.Barrier(num_arrivals=1, num_barriers=st)
    if problem.segment_ids:
        smem["q_seg_smem"] = plgpu.SMEM((wgs, rows), jnp.int32)
        smem["kv_seg_smem"] = plgpu.SMEM((st, bkv), jnp.int32)
    if problem.return_lse:
        smem["lse_smem"] = plgpu.SMEM((wgs, rows), jnp.float32)
    return smem


def smem_bytes(problem: Problem, config: TuningConfig, has_tiles: bool) -> int:
    """Shared memory of the buffers, from their shapes (barriers: 8 bytes each)."""
    total = 0
    for item in scratch_types(problem, config, has_tiles).values():
        if isinstance(item, plgpu.Barrier):
            total += 8 * math.prod(item.num_barriers)
        else:
            total += math.prod(item.shape) * jnp.dtype(item.dtype).itemsize
    return total


def make(problem: Problem, config: TuningConfig, block_plan: BlockPlan,
         interpret: Any = None, switches: Switches = ALL_ON):
    """The forward kernel: ``f(q, k_t, v[, q_seg, kv_seg]) -> out[, lse]``.

    Partial blocks use ``block_plan.mask_function`` on iota when it has one, else
    MaskInfo's partial tiles. ``interpret``: ``InterpretGPUParams`` to run in the Mosaic
    GPU interpreter, ``None`` for the real kernel. ``switches``: an ablation's parts off.
    """
    bq, bkv, stages, wgs = config.block_q, config.block_kv, config.stages, config.compute_wgs
    rows = bq // wgs
    if problem.seq_q % bq or problem.seq_kv % bkv:
        raise ValueError(f"sequence lengths ({problem.seq_q}, {problem.seq_kv}) must be "
                         f"multiples of ({bq=}, {bkv=})")
    q_blocks = problem.seq_q // bq
    if block_plan.count.shape[1] != q_blocks:
        raise ValueError(f"block plan has {block_plan.count.shape[1]} q-blocks, want {q_blocks}")
    dtype = jnp.dtype(problem.dtype)
    group = problem.heads_q // problem.heads_kv
    per_head_plan = block_plan.mask_heads > 1
    mask_function = block_plan.mask_function
    if interpret is not None:
        mgpu_interpret.prepare_host_interpreter()
        if wgs > 1:
            mgpu_interpret.check_host_pool(wgs + 1)
    has_tiles = mask_function is None
    evaluate_masks = switches.mask_evaluation

    def body(q_ref, kt_ref, v_ref, kv_block_ref, kind_ref, mask_block_ref, count_ref,
             tiles_ref, *refs, q_smem, k_smem, v_smem, p_smem, q_barrier,
             kv_barriers, consumed_barriers=None, o_smem=None, tile_smem=None,
             tile_barriers=None, q_seg_smem=None, kv_seg_smem=None, lse_smem=None):
        if problem.segment_ids:
            q_seg_ref, kv_seg_ref, *refs = refs
        out_ref, *refs = refs
        if problem.return_lse:
            (lse_ref,) = refs

        head = lax.axis_index("heads")
        q_block = lax.axis_index("q_blocks")
        kv_head = head // group
        plan_head = head if per_head_plan else 0
        count = count_ref[plan_head, q_block]

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
            if has_tiles and evaluate_masks:
                mgpu_mask.load_tile(kind_ref[plan_head, q_block, t] == PARTIAL, tiles_ref,
                                    mask_block_ref[plan_head, q_block, t],
                                    tile_smem, tile_barriers, slot)

        def prologue():
            for t in range(stages):
                pl.when(t < count)(functools.partial(issue, t, t))

        def compute(wg, release):
            """One warpgroup's rows; ``release(t, slot)`` hands a consumed slot back."""
            q_start = q_block * bq + wg * rows
            plgpu.copy_gmem_to_smem(q_ref.at[head, pl.ds(q_start, rows)], q_smem.at[wg],
                                    q_barrier.at[wg])
            if problem.segment_ids:
                plgpu.copy_gmem_to_smem(q_seg_ref.at[pl.ds(q_start, rows)],
                                        q_seg_smem.at[wg], q_barrier.at[wg])
            plgpu.barrier_wait(q_barrier.at[wg])

            q_segments = None
            if problem.segment_ids:
                q_segments = plgpu.layout_cast(q_seg_smem.at[wg][...], ROW)

            # Zeros in the accumulator's layouts: a fresh accumulator is zero-initialised.
            zero_o = pl.run_scoped(lambda acc: acc[...],
                                   plgpu.ACC((rows, problem.head_dim_v), jnp.float32))
            zero_row = pl.run_scoped(lambda acc: acc[...],
                                     plgpu.ACC((rows, bkv), jnp.float32)).max(axis=1)

            def step(t, carry):
                o, row_max, row_sum = carry
                slot = lax.rem(t, stages)
                kind = kind_ref[plan_head, q_block, t]
                kv_start = kv_block_ref[plan_head, q_block, t] * bkv
                plgpu.barrier_wait(kv_barriers.at[slot])

                def qk(acc):
                    plgpu.wgmma(acc, q_smem.at[wg], k_smem.at[slot])
                    return acc[...]

                s, _ = mgpu_mask.soft_cap(
                    pl.run_scoped(qk, plgpu.ACC((rows, bkv), jnp.float32)), problem.soft_cap)

                def tile():
                    plgpu.barrier_wait(tile_barriers.at[slot])
                    return tile_smem.at[slot, wg][...]

                if evaluate_masks:
                    s = mgpu_mask.partial_block(
                        s, kind == PARTIAL, mask_function, tile,
                        lambda: (mgpu_mask.iota((rows, bkv), 0, q_start),
                                 mgpu_mask.iota((rows, bkv), 1, kv_start)))
                if problem.segment_ids:
                    s = mgpu_mask.segments(s, q_segments,
                                           plgpu.layout_cast(kv_seg_smem.at[slot][...], COL))

                row_max_new = jnp.maximum(row_max, s.max(axis=1) * LOG2E)
                p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(row_max_new, s.shape, [0]))
                if switches.rescaling:
                    alpha = jnp.exp2(row_max - row_max_new)
                    row_sum = row_sum * alpha + p.sum(axis=1)
                else:
                    row_sum = row_sum + p.sum(axis=1)
                p_smem.at[wg][...] = p.astype(dtype)
                plgpu.commit_smem()

                def pv(acc):
                    plgpu.wgmma(acc, p_smem.at[wg], v_smem.at[slot])
                    return acc[...]

                o_step = pl.run_scoped(pv, plgpu.ACC((rows, problem.head_dim_v), jnp.float32))
                if switches.rescaling:
                    o = o * lax.broadcast_in_dim(alpha, o.shape, [0]) + o_step
                else:
                    o = o + o_step
                # Both wgmmas of this slot have completed (their results were read).
                release(t, slot)
                return o, row_max_new, row_sum

            o, row_max, row_sum = lax.fori_loop(0, count, step,
                                                (zero_o, zero_row + M_FLOOR, zero_row))
            seen = row_sum > 0
            # The last wgmma reading Q has completed (its result was read): Q's buffer is
            # free to stage O when the head dims agree.
            out_smem = (q_smem if o_smem is None else o_smem).at[wg]
            safe_sum = jnp.where(seen, row_sum, 1.0)
            inv_sum = jnp.where(seen, 1.0 / safe_sum, 0.0)  # a row that sees no key: 0
            out_smem[...] = (o * lax.broadcast_in_dim(inv_sum, o.shape, [0])).astype(dtype)
            if problem.return_lse:
                lse = (row_max + jnp.log2(safe_sum)) / LOG2E
                lse_smem.at[wg][...] = jnp.where(seen, lse, -jnp.inf)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_smem, out_ref.at[head, pl.ds(q_start, rows)])
            if problem.return_lse:
                plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[head, pl.ds(q_start, rows)])
            plgpu.wait_smem_to_gmem(0)

        if wgs == 1:
            # One warpgroup issues the copies and computes; it refills a slot itself.
            prologue()
            compute(0, lambda t, slot: pl.when(t + stages < count)(
                lambda: issue(t + stages, slot)))
            return

        wg = lax.axis_index("wg")

        @pl.when(wg < wgs)
        def _consumers():
            compute(wg, lambda t, slot: plgpu.barrier_arrive(consumed_barriers.at[slot]))

        @pl.when(wg == wgs)
        def _producer():
            prologue()

            @pl.loop(stages, jnp.maximum(count, stages))
            def _refill(t):
                slot = lax.rem(t, stages)
                plgpu.barrier_wait(consumed_barriers.at[slot])  # step t - stages is done
                issue(t, slot)

            # Observe the releases of the last steps, so every barrier phase completes.
            @pl.loop(jnp.maximum(count - stages, 0), count)
            def _drain(t):
                plgpu.barrier_wait(consumed_barriers.at[lax.rem(t, stages)])

    out_type = [jax.ShapeDtypeStruct((problem.heads_q, problem.seq_q, problem.head_dim_v),
                                     dtype)]
    if problem.return_lse:
        out_type.append(jax.ShapeDtypeStruct((problem.heads_q, problem.seq_q), jnp.float32))
    threads = {} if wgs == 1 else {"num_threads": wgs + 1, "thread_name": "wg"}
    call = plgpu.kernel(
        body, out_type=tuple(out_type), grid=(problem.heads_q, q_blocks),
        grid_names=("heads", "q_blocks"),
        scratch_types=scratch_types(problem, config, has_tiles), interpret=interpret,
        **threads)
    tables, tiles = plan_operands(block_plan, (bq, bkv), dtype)
    tiles = tiles.reshape(tiles.shape[0], wgs, rows, bkv)  # each warpgroup's rows

    def forward(q, k_t, v, q_seg=None, kv_seg=None):
        extra = ()
        if problem.segment_ids:
            extra = (q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32))
        outs = call(q, k_t, v, *tables, tiles, *extra)
        return outs if problem.return_lse else outs[0]

    return forward


def plan_operands(block_plan: BlockPlan, tile_shape: tuple[int, int], dtype):
    """A forward kernel's block-table operands (kv block, kind, mask block, count) and
    its partial tiles in ``dtype`` (one zero tile when the mask has a function)."""
    tables = tuple(jnp.asarray(a) for a in (block_plan.kv_block, block_plan.kind,
                                            block_plan.mask_block, block_plan.count))
    tiles = jnp.asarray(block_plan.partial_blocks if block_plan.mask_function is None
                        else np.zeros((1, *tile_shape), bool), dtype)
    return tables, tiles


def check_inputs(mask, q, k, v, segment_ids=None):
    """(q, k, v) with MQA's k and v made [1, S, D]; a ValueError naming the argument, what
    it got and what it needs, before anything is traced. Used by every public entry."""
    if k.ndim != v.ndim:
        raise ValueError(f"k and v: {k.shape} and {v.shape}; both [H,S,D] or both [S,D] (MQA)")
    if k.ndim == 2:  # MQA: one K/V shared by every query head
        k, v = k[None], v[None]
    if q.ndim != 3 or k.ndim != 3:
        raise ValueError(f"q: {q.shape}, k: {k.shape}; q needs [H,S,D], k and v [H,S,D] or "
                         "[S,D]")
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(f"v: {v.shape}; needs k's heads and length {k.shape[:2]}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"k: head dim {k.shape[2]}; needs q's head dim {q.shape[2]}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v: dtypes {q.dtype}, {k.dtype}, {v.dtype}; need one dtype")
    if mask.shape != (q.shape[0], q.shape[1], k.shape[1]):
        raise ValueError(f"mask: shape {mask.shape}; needs (Hq, Sq, Skv) = "
                         f"{(q.shape[0], q.shape[1], k.shape[1])}")
    if segment_ids is not None:
        check_segment_ids("segment_ids.q", segment_ids.q, q.shape[1])
        check_segment_ids("segment_ids.kv", segment_ids.kv, k.shape[1])
    return q, k, v


def check_segment_ids(name: str, ids, length: int) -> None:
    """A ValueError naming ``name`` unless ``ids`` are integers of shape (length,)."""
    shape = tuple(np.shape(ids))
    if shape != (length,):
        raise ValueError(f"{name}: shape {shape}; needs ({length},)")
    dtype = np.dtype(ids.dtype) if hasattr(ids, "dtype") else jnp.asarray(ids).dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{name}: dtype {dtype}; needs integers")


def splash_attention(mask, q, k, v, *, segment_ids=None, soft_cap: float | None = None,
                     return_lse: bool = False, config: TuningConfig = TuningConfig(),
                     interpret: Any = None):
    """Block-sparse attention: ``softmax(mask(cap(q kᵀ)))·v`` per head, no 1/sqrt(D).

    ``mask``: an upstream ``MultiHeadMask`` (one mask per query head); q [Hq, Sq, Dqk];
    k [Hkv, Skv, Dqk] and v [Hkv, Skv, Dv] (MHA/GQA), or k [Skv, Dqk] and v [Skv, Dv]
    (MQA); ``segment_ids``: upstream ``SegmentIds(q=[Sq], kv=[Skv])`` or None.
    Returns out [Hq, Sq, Dv] (and logsumexp [Hq, Sq] when ``return_lse``).
    """
    q, k, v = check_inputs(mask, q, k, v, segment_ids)
    from kernels.splash_attention import block_plan

    problem = Problem(q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2],
                      v.shape[2], jnp.dtype(q.dtype).name, soft_cap=soft_cap,
                      segment_ids=segment_ids is not None, return_lse=return_lse)
    forward = make(problem, config, block_plan.plan(mask, config.block_q, config.block_kv),
                   interpret=interpret)
    segments = () if segment_ids is None else (segment_ids.q, segment_ids.kv)
    return forward(q, jnp.swapaxes(k, 1, 2), v, *segments)
