"""Baselines: the MoE without NVFP4 (dense bf16 through XLA), and XLA's ragged dot.

Both read bf16 hidden states and the weights dequantized once to bf16 ([E, K, N]),
accumulate in f32 and store h and act in bf16, as a bf16 model would; both answer the
oracle's ``out_dense`` (the float64 dense path). Neither takes the 4-bit data: they are
the cost the NVFP4 path is meant to beat, not the same computation.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

INPUTS = ("hidden_bf16", "masked_m", "w1_bf16", "w2_bf16")
OUTPUT = "out_dense"  # the oracle's answer for the bf16 dense path, the one output of each


def _silu_mul(h):
    gate, up = jnp.split(h.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(gate) * up).astype(jnp.bfloat16)


def dense_bf16() -> Callable:
    """Per-expert GEMMs over every row (masked or not), intermediate materialised."""

    def moe(hidden, masked_m, w1, w2):
        del masked_m  # the dense path computes every row
        h = jnp.einsum("emk,ekn->emn", hidden, w1, preferred_element_type=jnp.float32)
        act = _silu_mul(h.astype(jnp.bfloat16))
        out = jnp.einsum("emn,enk->emk", act, w2, preferred_element_type=jnp.float32)
        return {OUTPUT: out.astype(jnp.bfloat16)}

    return moe


def ragged_dot() -> Callable:
    """Valid rows gathered to the front by expert, ``jax.lax.ragged_dot`` with
    group_sizes = masked_m for both GEMMs, scattered back (rows past masked_m are 0)."""

    def moe(hidden, masked_m, w1, w2):
        e, m, k = hidden.shape
        valid = (jnp.arange(m)[None, :] < masked_m[:, None]).reshape(-1)
        order = jnp.argsort(~valid, stable=True)  # valid rows first, expert-major
        rows = hidden.reshape(e * m, k)[order]
        sizes = masked_m.astype(jnp.int32)
        h = jax.lax.ragged_dot(rows, w1, sizes, preferred_element_type=jnp.float32)
        act = _silu_mul(h.astype(jnp.bfloat16))
        out = jax.lax.ragged_dot(act, w2, sizes, preferred_element_type=jnp.float32)
        back = jnp.zeros_like(out).at[order].set(out)
        return {OUTPUT: back.reshape(e, m, -1).astype(jnp.bfloat16)}

    return moe


BASELINES = {"dense_bf16": dense_bf16, "ragged_dot": ragged_dot}
