"""In-kernel masking shared by the forward, dQ and dK/dV kernels: a partial block's mask
(from the mask function on iota, or from MaskInfo's tile in SMEM), segment ids, and the
logit soft cap. Each works on a logits block in registers, in the accumulator's layout."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def iota(shape, dim: int, start, layout=plgpu.Layout.WGMMA):
    """Global positions along ``dim`` of a block starting at ``start``, in the layout of
    the logits (Hopper's wgmma accumulator, or Blackwell's read from tensor memory)."""
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=layout) + start


def soft_cap(s, cap: float | None):
    """cap·tanh(s/cap) and its derivative 1 - tanh²(s/cap) (s and None without a cap)."""
    if cap is None:
        return s, None
    t = jnp.tanh(s / cap)
    return cap * t, 1.0 - t * t


def load_tile(is_partial, tiles_ref, block, tile_smem, barriers, slot) -> None:
    """TMA-copy MaskInfo's partial tile ``block`` into ring ``slot`` when the block is
    partial (only then does ``partial_block`` wait on ``barriers.at[slot]``)."""

    @pl.when(is_partial)
    def _():
        plgpu.copy_gmem_to_smem(tiles_ref.at[block], tile_smem.at[slot], barriers.at[slot])


def partial_block(s, is_partial, mask_function, tile: Callable[[], object],
                  positions: Callable[[], tuple]):
    """-inf where a partial block's mask hides a logit; other blocks pass unchanged.

    ``mask_function(q_ids, kv_ids)`` on ``positions()`` when the mask has one, else the
    0/1 tile that ``tile()`` waits for and reads from SMEM. Both are called only
    inside the partial branch, so a full block neither builds iota nor waits."""

    def masked(s):
        visible = tile() > 0.5 if mask_function is None else mask_function(*positions())
        return jnp.where(visible, s, -jnp.inf)

    return lax.cond(is_partial, masked, lambda s: s, s)


def segments(s, row_ids, col_ids):
    """-inf where the row's and the column's segment ids differ."""
    same = (lax.broadcast_in_dim(row_ids, s.shape, [0])
            == lax.broadcast_in_dim(col_ids, s.shape, [1]))
    return jnp.where(same, s, -jnp.inf)
