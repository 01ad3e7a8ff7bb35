"""The Mosaic GPU port as the case sees it: a point's params -> kernel, plan, lowering.

Two variants share one kernel source (``mgpu_forward``):
- ``mgpu``: partial blocks of causal/local masks evaluated from iota with upstream's
  mask function (what upstream does for these masks);
- ``mgpu_mask_tiles``: the same mask without its index function, so partial
  blocks come from MaskInfo's deduplicated partial tiles, loaded by TMA: the path every
  other mask (numpy, combinations, per-head) takes.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from kernels import mgpu_lowering
from kernels.splash_attention import block_plan, mgpu_forward, upstream

VARIANTS = ("mgpu", "mgpu_mask_tiles")


def tuning(params: dict[str, Any]) -> mgpu_forward.TuningConfig:
    """The point's tile choice: ``params["tiles"]`` when given, else 64 x (128 | 64), 2."""
    given = params.get("tiles")
    if given:
        return mgpu_forward.TuningConfig(**given)
    return mgpu_forward.TuningConfig(
        block_q=64, block_kv=128 if params["head_dim"] <= 128 else 64, stages=2)


def problem(params: dict[str, Any]) -> mgpu_forward.Problem:
    s, d = params["seq_len"], params["head_dim"]
    return mgpu_forward.Problem(params["heads_q"], params["heads_kv"], s, s, d, d,
                                params["dtype"])


@functools.lru_cache(maxsize=16)
def _plan(mask_json: str, heads: int, seq_len: int, block_q: int, block_kv: int,
          tiles: bool) -> block_plan.BlockPlan:
    mask = upstream.mask({"seq_len": seq_len, "heads_q": heads, "mask": json.loads(mask_json)})
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


def plan(variant: str, params: dict[str, Any]) -> block_plan.BlockPlan:
    config = tuning(params)
    return _plan(json.dumps(params["mask"], sort_keys=True), params["heads_q"],
                 params["seq_len"], config.block_q, config.block_kv,
                 variant == "mgpu_mask_tiles")


def make(variant: str, params: dict[str, Any], interpret=None):
    """``f(q, k, v)`` on the case's [H, S, D] inputs (K is transposed to [H, D, S] first)."""
    forward = mgpu_forward.make(problem(params), tuning(params), plan(variant, params),
                                interpret=interpret)

    def attend(q, k, v):
        return forward(q, jnp.swapaxes(k, 1, 2), v)

    return attend


def arg_shapes(params: dict[str, Any]) -> tuple[jax.ShapeDtypeStruct, ...]:
    dtype = jnp.dtype(params["dtype"])
    s, d = params["seq_len"], params["head_dim"]
    return (jax.ShapeDtypeStruct((params["heads_q"], s, d), dtype),
            jax.ShapeDtypeStruct((params["heads_kv"], s, d), dtype),
            jax.ShapeDtypeStruct((params["heads_kv"], s, d), dtype))


def build(variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """Lower for sm_90a; grid, block, shared memory against the limit, block census."""
    config = tuning(params)
    the_plan = plan(variant, params)
    budget = mgpu_forward.smem_bytes(problem(params), config, the_plan.mask_function is None)
    if budget > mgpu_forward.SMEM_LIMIT_BYTES:
        raise ValueError(f"{variant} at {params}: {budget} bytes of shared memory exceed the "
                         f"{mgpu_forward.SMEM_LIMIT_BYTES}-byte limit ({config})")
    lowered = mgpu_lowering.lower_for_cuda(make(variant, params), arg_shapes(params))
    (launch,) = lowered["launches"]
    return {
        "artifacts": [{
            "target": "cuda sm_90a",
            "kind": "Pallas Mosaic GPU kernel (lowered on CPU, not run)",
            "seconds": lowered["seconds"],
            "facts": {**launch, "smem_limit_bytes": mgpu_forward.SMEM_LIMIT_BYTES,
                      "tuning": {"block_q": config.block_q, "block_kv": config.block_kv,
                                 "stages": config.stages},
                      "mask_source": ("MaskInfo partial tiles (TMA)"
                                      if the_plan.mask_function is None
                                      else "upstream mask function on iota")}}],
        "block_census": the_plan.census(),
        "block_table_heads": the_plan.mask_heads,
    }
