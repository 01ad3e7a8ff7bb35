"""The Mosaic GPU port as the case sees it: a point's params -> kernel, plan, lowering.

Two forward variants share one kernel source (``mgpu_forward``):
- ``mgpu``: partial blocks of causal/local masks evaluated from iota with upstream's
  mask function (what upstream does for these masks);
- ``mgpu_mask_tiles``: the same mask without its index function, so partial
  blocks come from MaskInfo's deduplicated partial tiles, loaded by TMA: the path every
  other mask (numpy, combinations, per-head) takes.

``mgpu_bwd`` is the backward: ``jax.vjp`` through the port (``mgpu_autodiff``), i.e. the
forward kernel with logsumexp, then the dQ and dK/dV kernels (``mgpu_backward``),
returning dq, dk, dv for the cotangent ``do``; ``mgpu_bwd_fused`` the same with one
kernel for all three (``mgpu_backward_fused``: dK/dV-stationary, dQ by a partitioned
reduction); ``mgpu_sm100a_bwd`` is the same through
the Blackwell kernels (``mgpu_forward_sm100``, ``mgpu_backward_sm100``).
Lowering them for their targets, budgets checked, is ``builds``.

``mgpu_sm100a`` and ``mgpu_sm100a_mask_tiles`` are the same two forward forms for
Blackwell (``mgpu_forward_sm100``: tcgen05 MMA, accumulators in tensor memory, warp
specialised, two q tiles in flight where they fit), lowered for sm_100a and run only on
a Blackwell GPU.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from kernels.splash_attention import (
    ablations,
    block_plan,
    masks,
    mgpu_autodiff,
    mgpu_backward,
    mgpu_backward_fused,
    mgpu_backward_sm100,
    mgpu_forward,
    mgpu_forward_sm100,
    upstream,
)

FORWARD_VARIANTS = ("mgpu", "mgpu_mask_tiles")  # Hopper; their tiles are tunable
BACKWARD_VARIANTS = ("mgpu_bwd",)  # Hopper; tunable
FUSED_BACKWARD = ("mgpu_bwd_fused",)  # Hopper: dQ, dK, dV in one kernel
BLACKWELL_FORWARD = ("mgpu_sm100a", "mgpu_sm100a_mask_tiles")
BLACKWELL_BACKWARD = ("mgpu_sm100a_bwd",)
BLACKWELL_VARIANTS = (*BLACKWELL_FORWARD, *BLACKWELL_BACKWARD)
# They return dq, dk, dv.
GRADIENT_VARIANTS = (*BACKWARD_VARIANTS, *FUSED_BACKWARD, *BLACKWELL_BACKWARD)
VARIANTS = (*FORWARD_VARIANTS, *BLACKWELL_FORWARD, *GRADIENT_VARIANTS)
# Partial blocks from MaskInfo's tiles, not from the mask function on iota.
MASK_TILE_VARIANTS = ("mgpu_mask_tiles", "mgpu_sm100a_mask_tiles")


def arch(variant: str) -> str:
    """The GPU architecture the variant's kernels are written for."""
    return "sm_100a" if variant in BLACKWELL_VARIANTS else "sm_90a"


def tuning(params: dict[str, Any]) -> mgpu_forward.TuningConfig:
    """The point's tile choice: ``params["tiles"]`` when given (the case config's row, or
    else the target's autotuned table row, which the pipeline adds: ``casebook.tile_table``),
    else block_q 64, 2 stages and the widest block_kv of (128, 64) whose shared memory
    fits the budget (with the partial-tile ring, so both forward variants fit)."""
    given = params.get("tiles")
    if given:
        return mgpu_forward.TuningConfig(**given)
    candidates = [mgpu_forward.TuningConfig(64, block_kv, 2) for block_kv in (128, 64)]
    for config in candidates:
        if (mgpu_forward.smem_bytes(problem(params), config, has_tiles=True)
                <= mgpu_forward.SMEM_LIMIT_BYTES):
            return config
    return candidates[-1]  # over budget even so: build() fails naming it


def blackwell_tuning(params: dict[str, Any]) -> mgpu_forward_sm100.TuningConfig:
    """The sm_100a forward's tile choice: two q tiles in flight where they fit, else one;
    the first of (q_tiles, block_kv, stages) = (2, 128, 2), (2, 64, 2), (2, 64, 1),
    (1, 128, 2), (1, 64, 2), (1, 64, 1) whose shared memory (with the partial-tile ring,
    so both Blackwell variants take the same tiles) and tensor memory fit."""
    the_problem = problem(params)
    candidates = [mgpu_forward_sm100.TuningConfig(block_kv, stages, q_tiles)
                  for q_tiles in (2, 1) for block_kv, stages in ((128, 2), (64, 2), (64, 1))]
    for config in candidates:
        try:
            mgpu_forward_sm100.check(the_problem, config, has_tiles=True)
        except ValueError:
            continue
        return config
    return candidates[-1]  # over budget even so: build() fails naming it


def backward_tuning(params: dict[str, Any]) -> mgpu_backward.BackwardConfig:
    """The backward's tile choice: ``params["bwd_tiles"]`` when given (config or tuned
    table row, as for ``tuning``), else 64 x 64 with the deepest ring of (2, 1) stages
    whose dQ and dK/dV kernels both fit the budget."""
    given = params.get("bwd_tiles")
    if given:
        return mgpu_backward.BackwardConfig(**given)
    candidates = [mgpu_backward.BackwardConfig(64, 64, stages) for stages in (2, 1)]
    for config in candidates:
        if max(mgpu_backward.smem_bytes(problem(params), config, has_tiles=False).values()) \
                <= mgpu_forward.SMEM_LIMIT_BYTES:
            return config
    return candidates[-1]  # over budget even so: build() fails naming it


SM_COUNT = 132  # an H100's or H200's SMs: the fused backward's CTAs fill them


def fused_backward_tuning(params: dict[str, Any]) -> mgpu_backward_fused.FusedBackwardConfig:
    """The fused backward's tiles, as ``backward_tuning`` chooses them for its budget
    (``params["bwd_tiles"]`` when given), and the dQ reduction's partitions: enough
    CTAs per kv head to fill ``SM_COUNT`` SMs, at most one per kv block."""
    given = params.get("bwd_tiles")
    candidates = ([mgpu_backward.BackwardConfig(**given)] if given else
                  [mgpu_backward.BackwardConfig(64, 64, stages) for stages in (2, 1)])
    kv_blocks = params["seq_len"] // candidates[0].block_kv
    parts = max(1, min(kv_blocks, SM_COUNT // params["heads_kv"]))
    configs = [mgpu_backward_fused.FusedBackwardConfig(c, parts) for c in candidates]
    for config in configs:
        if (mgpu_backward_fused.smem_bytes(problem(params), config, has_tiles=False)
                <= mgpu_forward.SMEM_LIMIT_BYTES):
            return config
    return configs[-1]  # over budget even so: build() fails naming it


def blackwell_backward_tuning(params: dict[str, Any]) -> mgpu_backward_sm100.BackwardConfig:
    """The sm_100a backward's tile choice: 64 columns per step and the deepest ring of
    (2, 1) stages whose every launch fits both budgets (the mask's own partial tiles
    counted when it has no mask function)."""
    has_tiles = plan("mgpu_sm100a_bwd", params).mask_function is None
    candidates = [mgpu_backward_sm100.BackwardConfig(64, stages) for stages in (2, 1)]
    for config in candidates:
        try:
            mgpu_backward_sm100.check(problem(params), config, has_tiles)
        except ValueError:
            continue
        return config
    return candidates[-1]  # over budget even so: build() fails naming it


def problem(params: dict[str, Any], return_lse: bool = False) -> mgpu_forward.Problem:
    s, d = params["seq_len"], params["head_dim"]
    return mgpu_forward.Problem(params["heads_q"], params["heads_kv"], s, s, d, d,
                                params["dtype"], soft_cap=params.get("soft_cap"),
                                segment_ids=bool(params.get("segments")),
                                return_lse=return_lse)


def segment_ids(params: dict[str, Any]):
    """upstream ``SegmentIds`` of the point's packed sequences, or None."""
    ids = masks.segment_ids(params)
    return None if ids is None else splash.SegmentIds(q=jnp.asarray(ids), kv=jnp.asarray(ids))


@functools.lru_cache(maxsize=16)
def _plan(mask_json: str, heads: int, seq_len: int, block_q: int, block_kv: int,
          tiles: bool) -> block_plan.BlockPlan:
    mask = multi_head_mask({"seq_len": seq_len, "heads_q": heads, "mask": json.loads(mask_json)})
    if tiles:
        mask = splash.MultiHeadMask([block_plan.WithoutIndexFunction(m)
                                     for m in mask.masks])
    return block_plan.plan(mask, block_q, block_kv)


def multi_head_mask(params: dict[str, Any]) -> splash.MultiHeadMask:
    """Upstream's mask object for the point (every head's)."""
    return upstream.mask({"seq_len": params["seq_len"], "heads_q": params["heads_q"],
                          "mask": params["mask"]})


def plan(variant: str, params: dict[str, Any]) -> block_plan.BlockPlan:
    """The forward's block plan (the Blackwell backward's dq kernel walks the forward's
    table at its own tiles)."""
    if variant in BLACKWELL_BACKWARD:
        block_q, block_kv = mgpu_backward_sm100.TILE, 64
    elif variant in BLACKWELL_FORWARD:
        config = blackwell_tuning(params)
        block_q, block_kv = config.block_q, config.block_kv
    else:
        config = tuning(params)
        block_q, block_kv = config.block_q, config.block_kv
    return _plan(json.dumps(params["mask"], sort_keys=True), params["heads_q"],
                 params["seq_len"], block_q, block_kv, variant in MASK_TILE_VARIANTS)


def make(variant: str, params: dict[str, Any], interpret=None):
    """``f(q, k, v)`` on the case's [H, S, D] inputs (K is transposed to [H, D, S] first)."""
    if variant in BLACKWELL_FORWARD:
        _refuse_interpreter(variant, interpret)
        forward = mgpu_forward_sm100.make(problem(params), blackwell_tuning(params),
                                          plan(variant, params))
    else:
        forward = mgpu_forward.make(problem(params), tuning(params), plan(variant, params),
                                    interpret=interpret)
    return _on_case_inputs(forward, params)


def make_ablation(name: str, params: dict[str, Any], interpret=None):
    """``f(q, k, v)`` of ablation ``name`` (``ablations``): its variant's kernel at the
    point's tiles, one part switched off."""
    config, switches = ablations.configured(name, tuning(params))
    forward = mgpu_forward.make(problem(params), config,
                                plan(ablations.find(name).of, params), interpret=interpret,
                                switches=switches)
    return _on_case_inputs(forward, params)


def _on_case_inputs(forward, params: dict[str, Any]):
    """The forward kernel on the case's q, k, v (and the point's segment ids)."""
    seg = segment_ids(params)
    segments = () if seg is None else (seg.q, seg.kv)

    def attend(q, k, v):
        return forward(q, jnp.swapaxes(k, 1, 2), v, *segments)

    return attend


def _refuse_interpreter(variant: str, interpret) -> None:
    if interpret is not None:
        raise ValueError(f"{variant}: no interpreter runs an sm_100a kernel (tcgen05, "
                         "tensor memory)")


def make_blackwell_backward(params: dict[str, Any]):
    """The sm_100a backward's launches behind one call (``mgpu_backward_sm100.make``)."""
    config = blackwell_backward_tuning(params)
    mask = multi_head_mask(params)
    return mgpu_backward_sm100.make(
        problem(params), config, plan("mgpu_sm100a_bwd", params),
        block_plan.plan_dkv(mask, config.block, mgpu_backward_sm100.TILE, params["heads_kv"]))


def make_fused_backward(params: dict[str, Any], interpret=None):
    """The Hopper backward in one kernel (``mgpu_backward_fused.make``)."""
    config = fused_backward_tuning(params)
    tiles = config.tiles
    return mgpu_backward_fused.make(
        problem(params, return_lse=True), config,
        block_plan.plan_dkv(multi_head_mask(params), tiles.block_q, tiles.block_kv,
                            params["heads_kv"]),
        interpret=interpret)


def make_backward(variant: str, params: dict[str, Any], interpret=None):
    """``f(q, k, v, do) -> {"dq", "dk", "dv"}``: jax.vjp through the port (Hopper's
    kernels, or Blackwell's forward with logsumexp and backward)."""
    mask = multi_head_mask(params)
    seg = segment_ids(params)
    if variant in FUSED_BACKWARD:
        forward = mgpu_forward.make(problem(params, return_lse=True), tuning(params),
                                    plan("mgpu", params), interpret=interpret)
        segments = () if seg is None else (seg.q, seg.kv)
        attend = mgpu_autodiff.joined(forward, make_fused_backward(params, interpret), segments)
    elif variant in BLACKWELL_BACKWARD:
        _refuse_interpreter(variant, interpret)
        forward = mgpu_forward_sm100.make(problem(params, return_lse=True),
                                          blackwell_tuning(params), plan("mgpu_sm100a", params))
        segments = () if seg is None else (seg.q, seg.kv)
        attend = mgpu_autodiff.joined(forward, make_blackwell_backward(params), segments)
    else:
        def attend(q, k, v):
            return mgpu_autodiff.splash_attention(
                mask, q, k, v, segment_ids=seg, soft_cap=params.get("soft_cap"),
                config=tuning(params), bwd_config=backward_tuning(params),
                interpret=interpret)

    def gradients(q, k, v, do):
        _, vjp = jax.vjp(attend, q, k, v)
        return dict(zip(("dq", "dk", "dv"), vjp(do.astype(q.dtype)), strict=True))

    return gradients
