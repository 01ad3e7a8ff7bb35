"""The Mosaic GPU port lowered for its targets on a CPU: each variant's kernels lowered
for sm_90a or sm_100a (``port`` makes them), their shared memory and tensor memory
checked against the limits before lowering, and what the lowering reports (launch, grid,
block, shared memory) with the point's block census."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from kernels import mgpu_lowering
from kernels.splash_attention import (
    ablations,
    block_plan,
    mgpu_backward,
    mgpu_backward_fused,
    mgpu_backward_sm100,
    mgpu_forward,
    mgpu_forward_sm100,
    port,
)


def arg_shapes(params: dict[str, Any]) -> tuple[jax.ShapeDtypeStruct, ...]:
    """q, k, v as the case lays them out: [heads, seq_len, head_dim], the point's dtype."""
    dtype = jnp.dtype(params["dtype"])
    s, d = params["seq_len"], params["head_dim"]
    return (jax.ShapeDtypeStruct((params["heads_q"], s, d), dtype),
            jax.ShapeDtypeStruct((params["heads_kv"], s, d), dtype),
            jax.ShapeDtypeStruct((params["heads_kv"], s, d), dtype))


def _lower_backward(backward, params: dict[str, Any]) -> dict[str, Any]:
    """Lower ``backward(q, k, v, out, lse, do, *segments)`` at the point's shapes."""
    q, k, v = arg_shapes(params)
    lse = jax.ShapeDtypeStruct((params["heads_q"], params["seq_len"]), jnp.float32)
    seg = port.segment_ids(params)
    segments = () if seg is None else (seg.q, seg.kv)
    return mgpu_lowering.lower_for_cuda(lambda *args: backward(*args, *segments),
                                        (q, k, v, q, lse, q))


def build_backward(params: dict[str, Any]) -> dict[str, Any]:
    """Lower the dQ and dK/dV kernels for sm_90a; each one's launch and shared memory."""
    config = port.backward_tuning(params)
    mask = port.multi_head_mask(params)
    the_problem = port.problem(params)
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
    config = port.fused_backward_tuning(params)
    the_problem = port.problem(params)
    asked = mgpu_backward_fused.smem_bytes(the_problem, config, has_tiles=False)
    over = (f"{asked:,} bytes of shared memory exceed the "
            f"{mgpu_forward.SMEM_LIMIT_BYTES:,}-byte limit ({config})")
    if asked > mgpu_forward.SMEM_LIMIT_BYTES and not params.get("bwd_tiles"):
        return {"artifacts": [], "out_of_scope": (
            f"no tile choice fits at head dim {params['head_dim']}: {over}; the two-kernel "
            "backward (mgpu_bwd) covers it")}
    if asked > mgpu_forward.SMEM_LIMIT_BYTES:
        raise ValueError(f"mgpu_bwd_fused at {params}: {over}")
    lowered = _lower_backward(port.make_fused_backward(params), params)
    (launch,) = lowered["launches"]
    tiles = config.tiles
    dq_plan = port.plan("mgpu", params)
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
    config = port.blackwell_tuning(params)
    the_plan = port.plan(variant, params)
    try:
        mgpu_forward_sm100.check(port.problem(params), config, the_plan.mask_function is None)
    except ValueError as error:
        raise ValueError(f"{variant} at {params}: {error}") from None
    return _forward_build(
        port.make(variant, params), params, the_plan, "cuda sm_100a",
        "Pallas Mosaic GPU kernel for Blackwell (lowered on CPU, not run)",
        {"block_q": config.block_q, "block_kv": config.block_kv, "stages": config.stages,
         "q_tiles_in_flight": config.q_tiles})


def build_blackwell_backward(params: dict[str, Any]) -> dict[str, Any]:
    """Lower the sm_100a backward's launches (dq, then dk+dv or dv and dk apart), each
    one's launch, shared memory and tensor-memory columns against the limits."""
    config = port.blackwell_backward_tuning(params)
    the_plan = port.plan("mgpu_sm100a_bwd", params)
    try:
        mgpu_backward_sm100.check(port.problem(params), config, the_plan.mask_function is None)
    except ValueError as error:
        raise ValueError(f"mgpu_sm100a_bwd at {params}: {error}") from None
    backward = port.make_blackwell_backward(params)
    lowered = _lower_backward(backward, params)
    names = ["dq", *("+".join(parts) for parts in mgpu_backward_sm100.dkv_parts(
        port.problem(params), config))]
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
    if variant in port.BLACKWELL_BACKWARD:
        return build_blackwell_backward(params)
    if variant in port.BACKWARD_VARIANTS:
        return build_backward(params)
    if variant in port.FUSED_BACKWARD:
        return build_fused_backward(params)
    if variant in port.BLACKWELL_FORWARD:
        return build_blackwell(variant, params)
    return _hopper_build(variant, port.make(variant, params), port.tuning(params),
                         port.plan(variant, params), params)


def build_ablation(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Lower ablation ``name`` for sm_90a as ``build`` lowers its variant."""
    config, _ = ablations.configured(name, port.tuning(params))
    return _hopper_build(name, port.make_ablation(name, params), config,
                         port.plan(ablations.find(name).of, params), params)


def _hopper_build(name: str, forward, config: mgpu_forward.TuningConfig,
                  the_plan: block_plan.BlockPlan, params: dict[str, Any]) -> dict[str, Any]:
    budget = mgpu_forward.smem_bytes(port.problem(params), config,
                                     the_plan.mask_function is None)
    if budget > mgpu_forward.SMEM_LIMIT_BYTES:
        raise ValueError(f"{name} at {params}: {budget} bytes of shared memory exceed the "
                         f"{mgpu_forward.SMEM_LIMIT_BYTES}-byte limit ({config})")
    return _forward_build(
        forward, params, the_plan, "cuda sm_90a",
        "Pallas Mosaic GPU kernel (lowered on CPU, not run)",
        {"block_q": config.block_q, "block_kv": config.block_kv, "stages": config.stages,
         "compute_warpgroups": config.compute_wgs})
