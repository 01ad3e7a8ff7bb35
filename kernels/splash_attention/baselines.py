"""Baselines: the cost without block sparsity, and what JAX offers without a kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from casebook.cases import NotRunnable
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
    """``jax.nn.dot_product_attention`` (XLA on CPU; cuDNN where the platform has it).

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


BASELINES = {"dense_masked": dense_masked, "xla_dot_product_attention": xla_dot_product_attention}


def make(name: str, params: dict[str, Any]) -> Callable:
    if name not in BASELINES:
        raise ValueError(f"unknown splash_attention baseline {name!r}; known: {sorted(BASELINES)}")
    return BASELINES[name](params)
