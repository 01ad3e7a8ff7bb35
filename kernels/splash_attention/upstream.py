"""The upstream TPU splash attention kernel, run by Pallas's interpreter."""

from __future__ import annotations

import importlib
from typing import Any

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

from kernels import mgpu_interpret
from kernels.splash_attention.masks import segment_ids

# MaskInfo's block classes, as upstream numbers them.
BLOCK_CLASSES = {0: "empty", 1: "partial", 2: "full"}


def on_tpu() -> str | None:
    """The TPU this process's jax runs on (its device kind), or None: upstream's kernel
    then runs compiled for the chip, not interpreted."""
    device = jax.devices()[0]
    return device.device_kind if device.platform == "tpu" else None


def mask(params: dict[str, Any]) -> splash.MultiHeadMask:
    n = params["seq_len"]
    spec = params["mask"]
    if spec["kind"] == "causal":
        head = splash.CausalMask((n, n))
    else:
        head = splash.LocalMask((n, n), tuple(spec["window"]), offset=0)
    return splash.MultiHeadMask([head] * params["heads_q"])


# The point key holding each upstream variant's block size where the autotune rule on a
# TPU picked one (results/<target>/splash_attention/tiles.yaml); else ``block`` (default
# 128, upstream's BlockSizes default) serves both.
TUNED_KEYS = {"upstream": "upstream_blocks", "upstream_bwd": "upstream_bwd_blocks"}
DEFAULT_BLOCK = 128


def block(params: dict[str, Any], variant: str = "upstream") -> int:
    """The block size ``variant`` runs at ``params``: its tuned row, else ``block``."""
    tuned = params.get(TUNED_KEYS[variant])
    return tuned["block"] if tuned else params.get("block", DEFAULT_BLOCK)


def block_sizes(params: dict[str, Any], variant: str = "upstream") -> splash.BlockSizes:
    """One block size for the forward, dq and dkv kernels (the separate dq/dkv kernels,
    upstream's default, not the fused backward)."""
    size = block(params, variant)
    return splash.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size,
                             block_q_dkv=size, block_kv_dkv=size,
                             block_kv_dkv_compute=size, block_q_dq=size,
                             block_kv_dq=size)


def block_table(params: dict[str, Any], variant: str = "upstream") -> np.ndarray:
    """Upstream MaskInfo's class of every (head, q-block, kv-block) tile.

    Heads with identical masks share one table row, so the first axis counts distinct
    head masks, not heads.
    """
    bs = block_sizes(params, variant)
    # Upstream's own arguments, in its order: the kernel's call then hits the same
    # lru_cache entry instead of classifying the mask again.
    info, _ = splash_attention_mask_info.process_mask(
        mask(params), (bs.block_q, bs.block_kv), downcast_smem_data=True, head_shards=1,
        q_seq_shards=1)
    return np.asarray(info.block_mask)


def block_census(classes: np.ndarray) -> dict[str, int]:
    """How many tiles of a block table fall in each class."""
    return {name: int((classes == code).sum()) for code, name in BLOCK_CLASSES.items()}


def checking_mode() -> pltpu.InterpretParams:
    """The TPU interpret mode: uninitialised memory reads as NaN, races reported (its
    callbacks given numpy arguments: ``mgpu_interpret.numpy_callback_arguments``)."""
    mgpu_interpret.numpy_callback_arguments()
    return pltpu.InterpretParams(uninitialized_memory="nan", detect_races=True)


def make(params: dict[str, Any], interpret: bool | pltpu.InterpretParams,
         variant: str = "upstream"):
    """The upstream kernel for ``params``: a callable of (q, k, v) (the point's segment
    ids, when it packs sequences, and soft cap are fixed by ``params``), at ``variant``'s
    block size."""
    kernel = splash.make_splash_mha_single_device(
        mask(params), block_sizes=block_sizes(params, variant), interpret=interpret,
        attn_logits_soft_cap=params.get("soft_cap"))
    ids = segment_ids(params)
    if ids is None:
        return kernel
    segments = splash.SegmentIds(q=ids, kv=ids)
    return lambda q, k, v: kernel(q, k, v, segment_ids=segments)


def make_backward(params: dict[str, Any], interpret: bool | pltpu.InterpretParams):
    """``f(q, k, v, do) -> {"dq", "dk", "dv"}``: jax.vjp through the upstream kernel's own
    custom VJP (its dq and dkv kernels), at ``upstream_bwd``'s block size."""
    attend = make(params, interpret, "upstream_bwd")

    def gradients(q, k, v, do):
        _, vjp = jax.vjp(attend, q, k, v)
        return dict(zip(("dq", "dk", "dv"), vjp(do.astype(q.dtype)), strict=True))

    return gradients


def races_found() -> bool:
    """Whether the TPU interpreter's race detector saw a race since the last reset."""
    state = importlib.import_module("jax._src.pallas.mosaic.interpret.interpret_pallas_call")
    return bool(state.races is not None and state.races.races_found)


def reset_interpreter() -> None:
    pltpu.reset_tpu_interpret_mode_state()
