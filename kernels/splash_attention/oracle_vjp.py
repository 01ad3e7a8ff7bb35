"""The differentiable reference: the oracle's dense masked attention written in jax.numpy,
differentiated by JAX's autodiff in float64 (the gradient oracle of the backward pass).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def attention(q, k, v, mask, *, segment_ids=None, soft_cap: float | None = None,
              cap_gradient: bool = True):
    """As ``oracle_f64.attention`` (same conventions), in jax.numpy at the inputs' dtype.

    ``cap_gradient=False`` (a near miss, not the reference): the soft cap applies in the
    forward, but its derivative 1 - tanh² is dropped in the backward (straight through)."""
    group = q.shape[0] // k.shape[0]
    k, v = jnp.repeat(k, group, axis=0), jnp.repeat(v, group, axis=0)
    logits = jnp.einsum("hqd,hkd->hqk", q, k)
    if soft_cap is not None:
        capped = soft_cap * jnp.tanh(logits / soft_cap)
        logits = capped if cap_gradient else logits + jax.lax.stop_gradient(capped - logits)
    visible = jnp.broadcast_to(jnp.asarray(mask, bool), logits.shape)
    if segment_ids is not None:
        q_seg, kv_seg = (jnp.asarray(s) for s in segment_ids)
        visible = visible & (q_seg[:, None] == kv_seg[None, :])
    seen = visible.any(axis=-1, keepdims=True)
    peak = jax.lax.stop_gradient(
        jnp.where(seen, jnp.where(visible, logits, -jnp.inf).max(axis=-1, keepdims=True), 0.0))
    weights = jnp.where(visible, jnp.exp(jnp.where(visible, logits, 0.0) - peak), 0.0)
    total = jnp.where(seen, weights.sum(axis=-1, keepdims=True), 1.0)
    return jnp.einsum("hqk,hkd->hqd", weights / total, v)


def gradients(q, k, v, do, mask, *, segment_ids=None, soft_cap: float | None = None,
              cap_gradient: bool = True):
    """float64 ``(out, dq, dk, dv)`` for cotangent ``do``, by autodiff of ``attention``.

    MQA k, v [Skv, D] give dk, dv [Skv, D] (summed over every query head)."""
    with jax.enable_x64(True):
        args = [jnp.asarray(np.asarray(x, np.float64)) for x in (q, k, v)]
        mqa = args[1].ndim == 2

        def f(q, k, v):
            if mqa:
                k, v = k[None], v[None]
            return attention(q, k, v, mask, segment_ids=segment_ids, soft_cap=soft_cap,
                             cap_gradient=cap_gradient)

        out, vjp = jax.vjp(f, *args)
        grads = vjp(jnp.asarray(np.asarray(do, np.float64)))
        return tuple(np.asarray(x, np.float64) for x in (out, *grads))
