"""Baselines: the cost without block sparsity, and what JAX offers without a kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from kernels.contract import NotRunnable
from kernels.splash_attention.masks import segment_ids, visible


def dense_masked(params: dict[str, Any]) -> Callable:
    """Every block of q kᵀ computed, then masked: attention without the sparsity."""
    mask = jnp.asarray(visible(params))
    cap = params.get("soft_cap")

    def attend(q, k, v):
        group = q.shape[0] // k.shape[0]
        k, v = jnp.repeat(k, group, axis=0), jnp.repeat(v, group, axis=0)
        logits = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=jnp.float32)
        if cap is not None:
            logits = cap * jnp.tanh(logits / cap)
        logits = jnp.where(mask, logits, -jnp.inf)
        weights = jax.nn.softmax(logits, axis=-1)
        return jnp.einsum("hqk,hkd->hqd", weights.astype(v.dtype), v).astype(q.dtype)

    return attend


def xla_dot_product_attention(params: dict[str, Any]) -> Callable:
    """``jax.nn.dot_product_attention`` with its default implementation, which is XLA's
    on every platform (jax 0.10 and 0.11 choose XLA for ``implementation=None``).

    Packed sequences go in as its ``q_seqlen``-free boolean ``mask``; it has no logit
    soft cap, so a point with one cannot be run by it."""
    if params.get("soft_cap") is not None:
        raise NotRunnable("jax.nn.dot_product_attention has no logit soft cap")
    spec = params["mask"]
    window = None if spec["kind"] == "causal" else tuple(spec["window"])
    ids = segment_ids(params)
    packed = None if ids is None else jnp.asarray(ids[:, None] == ids[None, :])[None, None]

    # XLA's CPU dot has no f16 x f16 -> f32 form ("precision F16_F16_F32 is not
    # supported"): on a CPU host, f16 attention is what a JAX user gets by computing in
    # f32 and rounding back. Other dtypes and GPU hosts run as given.
    upcast = params["dtype"] == "float16" and jax.default_backend() == "cpu"

    def attend(q, k, v):
        dtype = q.dtype
        if upcast:
            q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
        # [H, S, D] -> [B=1, S, H, D], the layout jax.nn expects; scale 1: q is pre-scaled.
        q4, k4, v4 = (x.transpose(1, 0, 2)[None] for x in (q, k, v))
        out = jax.nn.dot_product_attention(
            q4, k4, v4, mask=packed, scale=1.0, is_causal=spec["kind"] == "causal",
            local_window_size=window)
        return out[0].transpose(1, 0, 2).astype(dtype)

    return attend


def cudnn_gap(params: dict[str, Any]) -> str | None:
    """Why cuDNN's attention through jax.nn cannot compute this point's attention, or None."""
    spec = params["mask"]
    if params.get("soft_cap") is not None:
        return "jax.nn.dot_product_attention has no logit soft cap"
    if segment_ids(params) is not None:
        return "jax.nn passes cuDNN sequence lengths, not segment ids"
    if params["dtype"] not in ("float16", "bfloat16"):
        return "cuDNN flash attention needs f16/bf16"
    if spec["kind"] == "local" and spec["window"][1] != 0:
        return "cuDNN takes a left window only (right window 0) without a causal mask"
    if spec["kind"] not in ("causal", "local"):
        return f"cuDNN through jax.nn has no {spec['kind']} mask"
    return None


def cudnn_dot_product_attention(params: dict[str, Any]) -> Callable:
    """``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused flash
    attention, where it applies; on NVIDIA GPUs only."""
    why = cudnn_gap(params)
    if why:
        raise NotRunnable(why)
    if jax.default_backend() != "gpu":
        raise NotRunnable("cuDNN attention needs an NVIDIA GPU; this host has none")
    spec = params["mask"]
    window = None if spec["kind"] == "causal" else tuple(spec["window"])

    def attend(q, k, v):  # [H, S, D] -> [B=1, S, H, D] and back; q is pre-scaled
        q4, k4, v4 = (x.transpose(1, 0, 2)[None] for x in (q, k, v))
        out = jax.nn.dot_product_attention(
            q4, k4, v4, scale=1.0, is_causal=spec["kind"] == "causal",
            local_window_size=window, implementation="cudnn")
        return out[0].transpose(1, 0, 2)

    return attend


def attention_mgpu_gap(params: dict[str, Any]) -> str | None:
    """Why upstream's attention_mgpu cannot compute this point's attention, or None."""
    if params["mask"]["kind"] != "causal":
        return f"attention_mgpu has no {params['mask']['kind']} mask (causal or none only)"
    if segment_ids(params) is not None or params.get("soft_cap") is not None:
        return "attention_mgpu has no segment ids or logit soft cap"
    if params["dtype"] not in ("float16", "bfloat16") or params["head_dim"] % 64:
        return "attention_mgpu needs f16/bf16 and a head dim that is a multiple of 64"
    return None


def attention_mgpu(params: dict[str, Any]) -> Callable:
    """Upstream's Hopper flash attention in Pallas Mosaic GPU
    (``jax.experimental.pallas.ops.gpu.attention_mgpu``: FA3-style, two compute
    warpgroups), where it applies; it runs on sm_90 GPUs only."""
    why = attention_mgpu_gap(params)
    if why:
        raise NotRunnable(why)
    device = jax.devices()[0]
    if getattr(device, "compute_capability", None) != "9.0":
        raise NotRunnable("upstream attention_mgpu is a Hopper kernel: it needs an sm_90 "
                          "GPU; this host has none")
    from jax.experimental.pallas.ops.gpu import attention_mgpu as upstream_mgpu

    config = upstream_mgpu.TuningConfig(block_q=128, block_kv=64, max_concurrent_steps=2,
                                        causal=True)

    def attend(q, k, v):  # [H, S, D] -> [B=1, S, H, D] and back; q is pre-scaled
        q4, k4, v4 = (x.transpose(1, 0, 2)[None] for x in (q, k, v))
        return upstream_mgpu.attention(q4, k4, v4, config)[0].transpose(1, 0, 2)

    return attend


BASELINES = {"dense_masked": dense_masked, "xla_dot_product_attention": xla_dot_product_attention,
             "cudnn_dot_product_attention": cudnn_dot_product_attention,
             "attention_mgpu": attention_mgpu}
# How each runs, as its records say.
MODES = {"dense_masked": "XLA",
         "xla_dot_product_attention": "XLA (jax.nn.dot_product_attention, implementation "
                                      "None, which is XLA)",
         "cudnn_dot_product_attention": "cuDNN flash attention (jax.nn.dot_product_attention, "
                                        "implementation='cudnn')",
         "attention_mgpu": "Pallas Mosaic GPU kernel (upstream attention_mgpu)"}


def make(name: str, params: dict[str, Any]) -> Callable:
    if name not in BASELINES:
        raise ValueError(f"unknown splash_attention baseline {name!r}; known: {sorted(BASELINES)}")
    return BASELINES[name](params)
