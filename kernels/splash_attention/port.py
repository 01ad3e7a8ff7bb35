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

from kernels import mgpu_lowering
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
    mask = _mask({"seq_len": seq_len, "heads_q": heads, "mask": json.loads(mask_json)})
    if tiles:
        mask = splash.MultiHeadMask([WithoutIndexFunction(m) for m in mask.masks])
    return block_plan.plan(mask, block_q, block_kv)


class WithoutIndexFunction(splash.splash_attention_mask.Mask):
    """The same mask, minus its index function: MaskInfo then keeps partial tiles.

    Equivalent to ``NumpyMask(mask[:, :])`` without materialising S x S booleans.
    """

    def __init__(self, mask):
        self.mask = mask

    @property
    def shape(self):
        return self.mask.shape

    def __getitem__(self, index):
        return self.mask[index]

    def __eq__(self, other):
        return isinstance(other, WithoutIndexFunction) and self.mask == other.mask

    def __hash__(self):
        return hash((WithoutIndexFunction, self.mask))


def _mask(params: dict[str, Any]) -> splash.MultiHeadMask:
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


def _blackwell_backward(params: dict[str, Any]):
    """The sm_100a backward's launches behind one call (``mgpu_backward_sm100.make``)."""
    config = blackwell_backward_tuning(params)
    mask = _mask(params)
    return mgpu_backward_sm100.make(
        problem(params), config, plan("mgpu_sm100a_bwd", params),
        block_plan.plan_dkv(mask, config.block, mgpu_backward_sm100.TILE, params["heads_kv"]))


def _fused_backward(params: dict[str, Any], interpret=None):
    """The Hopper backward in one kernel (``mgpu_backward_fused.make``)."""
    config = fused_backward_tuning(params)
    tiles = config.tiles
    return mgpu_backward_fused.make(
        problem(params, return_lse=True), config,
        block_plan.plan_dkv(_mask(params), tiles.block_q, tiles.block_kv, params["heads_kv"]),
        interpret=interpret)


def make_backward(variant: str, params: dict[str, Any], interpret=None):
    """``f(q, k, v, do) -> {"dq", "dk", "dv"}``: jax.vjp through the port (Hopper's
    kernels, or Blackwell's forward with logsumexp and backward)."""
    mask = _mask(params)
    seg = segment_ids(params)
    if variant in FUSED_BACKWARD:
        forward = mgpu_forward.make(problem(params, return_lse=True), tuning(params),
                                    plan("mgpu", params), interpret=interpret)
        segments = () if seg is None else (seg.q, seg.kv)
        attend = mgpu_autodiff.joined(forward, _fused_backward(params, interpret), segments)
    elif variant in BLACKWELL_BACKWARD:
        _refuse_interpreter(variant, interpret)
        forward = mgpu_forward_sm100.make(problem(params, return_lse=True),
                                          blackwell_tuning(params), plan("mgpu_sm100a", params))
        segments = () if seg is None else (seg.q, seg.kv)
        attend = mgpu_autodiff.joined(forward, _blackwell_backward(params), segments)
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


def arg_shapes(params: dict[str, Any]) -> tuple[jax.ShapeDtypeStruct, ...]:
    dtype = jnp.dtype(params["dtype"])
    s, d = params["seq_len"], params["head_dim"]
    return (jax.ShapeDtypeStruct((params["heads_q"], s, d), dtype),
            jax.ShapeDtypeStruct((params["heads_kv"], s, d), dtype),
            jax.ShapeDtypeStruct((params["heads_kv"], s, d), dtype))


def _lower_backward(backward, params: dict[str, Any]) -> dict[str, Any]:
    """Lower ``backward(q, k, v, out, lse, do, *segments)`` at the point's shapes."""
    q, k, v = arg_shapes(params)
    lse = jax.ShapeDtypeStruct((params["heads_q"], params["seq_len"]), jnp.float32)
    seg = segment_ids(params)
    segments = () if seg is None else (seg.q, seg.kv)
    return mgpu_lowering.lower_for_cuda(lambda *args: backward(*args, *segments),
                                        (q, k, v, q, lse, q))


def build_backward(params: dict[str, Any]) -> dict[str, Any]:
    """Lower the dQ and dK/dV kernels for sm_90a; each one's launch and shared memory."""
    config = backward_tuning(params)
    mask = _mask(params)
    the_problem = problem(params)
    budget = mgpu_backward.smem_bytes(the_problem, config, has_tiles=False)
    for kernel_name, asked in budget.items():
        if asked > mgpu_forward.SMEM_LIMIT_BYTES:
            raise ValueError(f"mgpu_bwd ({kernel_name} kernel) at {params}: {asked} bytes of "
                             f"shared memory exceed the {mgpu_forward.SMEM_LIMIT_BYTES}-byte "
                             f"limit ({config})")
    dq_plan = block_plan.plan(mask, config.block_q, config.block_kv)
    backward = mgpu_backward.make(
        the_problem, config, dq_plan,
        block_plan.plan_dkv(mask, config.block_q, config.block_kv, params["heads_kv"]))
    lowered = _lower_backward(backward, params)
    tuning_facts = {"block_q": config.block_q, "block_kv": config.block_kv,
                    "stages": config.stages}
    return {
        "artifacts": [{
            "target": "cuda sm_90a",
            "kind": f"Pallas Mosaic GPU {name} kernel (lowered on CPU, not run)",
            "seconds": lowered["seconds"],
            "facts": {**launch, "kernel": name, "smem_limit_bytes":
                      mgpu_forward.SMEM_LIMIT_BYTES, "tuning": tuning_facts,
                      "mask_source": "upstream mask function on iota"}}
            for name, launch in zip(("dq", "dkv"), lowered["launches"], strict=True)],
        "block_census": dq_plan.census(),
        "block_table_heads": dq_plan.mask_heads,
    }


def build_fused_backward(params: dict[str, Any]) -> dict[str, Any]:
    """Lower the fused backward for sm_90a: its launch, shared memory, and the bytes of
    its dQ reduction's f32 partitions; where no tile choice fits the budget (head dim
    256), nothing, and why (a row given in ``bwd_tiles`` that does not fit fails)."""
    config = fused_backward_tuning(params)
    the_problem = problem(params)
    asked = mgpu_backward_fused.smem_bytes(the_problem, config, has_tiles=False)
    over = (f"{asked:,} bytes of shared memory exceed the "
            f"{mgpu_forward.SMEM_LIMIT_BYTES:,}-byte limit ({config})")
    if asked > mgpu_forward.SMEM_LIMIT_BYTES and not params.get("bwd_tiles"):
        return {"artifacts": [], "out_of_scope": (
            f"no tile choice fits at head dim {params['head_dim']}: {over}; the two-kernel "
            "backward (mgpu_bwd) covers it")}
    if asked > mgpu_forward.SMEM_LIMIT_BYTES:
        raise ValueError(f"mgpu_bwd_fused at {params}: {over}")
    lowered = _lower_backward(_fused_backward(params), params)
    (launch,) = lowered["launches"]
    tiles = config.tiles
    dq_plan = plan("mgpu", params)
    return {
        "artifacts": [{
            "target": "cuda sm_90a",
            "kind": "Pallas Mosaic GPU fused dq+dk+dv kernel (lowered on CPU, not run)",
            "seconds": lowered["seconds"],
            "facts": {**launch, "kernel": "dq+dk+dv",
                      "smem_limit_bytes": mgpu_forward.SMEM_LIMIT_BYTES,
                      "tuning": {"block_q": tiles.block_q, "block_kv": tiles.block_kv,
                                 "stages": tiles.stages, "dq_partitions": config.partitions},
                      "dq_partial_bytes": mgpu_backward_fused.partial_bytes(the_problem, config),
                      "mask_source": "upstream mask function on iota"}}],
        "block_census": dq_plan.census(),
        "block_table_heads": dq_plan.mask_heads,
    }


def _forward_build(forward, params: dict[str, Any], the_plan: block_plan.BlockPlan,
                   target: str, kind: str, tuning_facts: dict[str, int]) -> dict[str, Any]:
    """Lower a forward kernel, budgets checked: its launch facts and block census."""
    lowered = mgpu_lowering.lower_for_cuda(forward, arg_shapes(params))
    (launch,) = lowered["launches"]
    return {
        "artifacts": [{
            "target": target, "kind": kind, "seconds": lowered["seconds"],
            "facts": {**launch, "smem_limit_bytes": mgpu_forward.SMEM_LIMIT_BYTES,
                      "tuning": tuning_facts,
                      "mask_source": ("MaskInfo partial tiles (TMA)"
                                      if the_plan.mask_function is None
                                      else "upstream mask function on iota")}}],
        "block_census": the_plan.census(),
        "block_table_heads": the_plan.mask_heads,
    }


def build_blackwell(variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """Lower for sm_100a; grid, block, shared memory and tensor-memory columns against
    their limits, the MMA's kind, block census."""
    config = blackwell_tuning(params)
    the_plan = plan(variant, params)
    try:
        mgpu_forward_sm100.check(problem(params), config, the_plan.mask_function is None)
    except ValueError as error:
        raise ValueError(f"{variant} at {params}: {error}") from None
    return _forward_build(
        make(variant, params), params, the_plan, "cuda sm_100a",
        "Pallas Mosaic GPU kernel for Blackwell (lowered on CPU, not run)",
        {"block_q": config.block_q, "block_kv": config.block_kv, "stages": config.stages,
         "q_tiles_in_flight": config.q_tiles})


def build_blackwell_backward(params: dict[str, Any]) -> dict[str, Any]:
    """Lower the sm_100a backward's launches (dq, then dk+dv or dv and dk apart), each
    one's launch, shared memory and tensor-memory columns against the limits."""
    config = blackwell_backward_tuning(params)
    the_plan = plan("mgpu_sm100a_bwd", params)
    try:
        mgpu_backward_sm100.check(problem(params), config, the_plan.mask_function is None)
    except ValueError as error:
        raise ValueError(f"mgpu_sm100a_bwd at {params}: {error}") from None
    backward = _blackwell_backward(params)
    lowered = _lower_backward(backward, params)
    names = ["dq", *("+".join(parts) for parts in mgpu_backward_sm100.dkv_parts(
        problem(params), config))]
    return {
        "artifacts": [{
            "target": "cuda sm_100a",
            "kind": f"Pallas Mosaic GPU {name} kernel for Blackwell (lowered on CPU, not run)",
            "seconds": lowered["seconds"],
            "facts": {**launch, "kernel": name,
                      "smem_limit_bytes": mgpu_forward.SMEM_LIMIT_BYTES,
                      "tuning": {"tile": mgpu_backward_sm100.TILE, "block": config.block,
                                 "stages": config.stages},
                      "mask_source": "upstream mask function on iota"}}
            for name, launch in zip(names, lowered["launches"], strict=True)],
        "block_census": the_plan.census(),
        "block_table_heads": the_plan.mask_heads,
    }


def build(variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """Lower for the variant's architecture; grid, block, shared memory against the
    limit (and tensor memory on sm_100a), block census."""
    if variant in BLACKWELL_BACKWARD:
        return build_blackwell_backward(params)
    if variant in BACKWARD_VARIANTS:
        return build_backward(params)
    if variant in FUSED_BACKWARD:
        return build_fused_backward(params)
    if variant in BLACKWELL_FORWARD:
        return build_blackwell(variant, params)
    return _hopper_build(variant, make(variant, params), tuning(params), plan(variant, params),
                         params)


def build_ablation(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Lower ablation ``name`` for sm_90a as ``build`` lowers its variant."""
    config, _ = ablations.configured(name, tuning(params))
    return _hopper_build(name, make_ablation(name, params), config,
                         plan(ablations.find(name).of, params), params)


def _hopper_build(name: str, forward, config: mgpu_forward.TuningConfig,
                  the_plan: block_plan.BlockPlan, params: dict[str, Any]) -> dict[str, Any]:
    budget = mgpu_forward.smem_bytes(problem(params), config, the_plan.mask_function is None)
    if budget > mgpu_forward.SMEM_LIMIT_BYTES:
        raise ValueError(f"{name} at {params}: {budget} bytes of shared memory exceed the "
                         f"{mgpu_forward.SMEM_LIMIT_BYTES}-byte limit ({config})")
    return _forward_build(
        forward, params, the_plan, "cuda sm_90a",
        "Pallas Mosaic GPU kernel (lowered on CPU, not run)",
        {"block_q": config.block_q, "block_kv": config.block_kv, "stages": config.stages,
         "compute_warpgroups": config.compute_wgs})
