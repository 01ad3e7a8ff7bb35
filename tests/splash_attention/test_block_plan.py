"""The block plan from a mask's band against upstream's MaskInfo, tile for tile."""

import dataclasses

import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

from kernels.splash_attention import block_plan

BLOCKS = (8, 16, 32, 64)


def band_mask(rng: np.random.Generator, q_len: int, kv_len: int) -> mask_lib.Mask:
    """A causal or local mask with a random offset (and window, either side possibly
    unbounded)."""
    offset = int(rng.integers(-kv_len, q_len))
    if rng.random() < 0.4:
        return mask_lib.CausalMask((q_len, kv_len), offset=offset)
    window = tuple(None if rng.random() < 0.2 else int(rng.integers(0, kv_len + 8))
                   for _ in range(2))
    return mask_lib.LocalMask((q_len, kv_len), window, offset=offset)


def upstream_plans(mask, block_q, block_kv, heads_kv):
    """``plan`` and ``plan_dkv`` as upstream's MaskInfo alone makes them."""
    def no_band(*_):
        return None
    saved, block_plan.band = block_plan.band, no_band
    try:
        return (block_plan.plan(mask, block_q, block_kv),
                block_plan.plan_dkv(mask, block_q, block_kv, heads_kv))
    finally:
        block_plan.band = saved


def assert_same_plan(got, want, what):
    for field in dataclasses.fields(want):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if field.name == "mask_function":
            assert a is b, what
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{field.name}: {what}")
            assert a.dtype == b.dtype, f"{field.name}: {what}"


def test_band_classes_are_upstreams_table(rng):
    for _ in range(60):
        block_q, block_kv = (int(b) for b in rng.choice(BLOCKS, 2))
        q_len = block_q * int(rng.integers(1, 9))
        kv_len = block_kv * int(rng.integers(1, 9))
        mask = band_mask(rng, q_len, kv_len)
        got = block_plan.band(mask_lib.MultiHeadMask([mask]), block_q, block_kv).classes()
        info, _ = splash_attention_mask_info.process_mask(
            mask_lib.MultiHeadMask([mask]), (block_q, block_kv), downcast_smem_data=False,
            shrink_grid=False)
        np.testing.assert_array_equal(got, info.block_mask, err_msg=repr(mask.__dict__))


@pytest.mark.parametrize("tiles", [False, True], ids=["mask_function", "mask_tiles"])
def test_plans_from_the_band_are_upstreams(rng, tiles):
    """Every field, the mask function itself where it serves, else the partial tiles in
    upstream's order and each tile's index (dkv: transposed)."""
    for _ in range(12):
        block_q, block_kv = (int(b) for b in rng.choice(BLOCKS, 2))
        n = int(np.lcm(block_q, block_kv)) * int(rng.integers(1, 4))
        heads_kv, group = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        head = band_mask(rng, n, n)
        if tiles:
            head = block_plan.WithoutIndexFunction(head)
        mask = mask_lib.MultiHeadMask([head] * (heads_kv * group))
        want, want_dkv = upstream_plans(mask, block_q, block_kv, heads_kv)
        assert (want.mask_function is None) == tiles
        what = f"{vars(head)} blocks {block_q}x{block_kv}"
        assert_same_plan(block_plan.plan(mask, block_q, block_kv), want, what)
        assert_same_plan(block_plan.plan_dkv(mask, block_q, block_kv, heads_kv), want_dkv,
                         what)


def test_other_masks_are_left_to_upstream():
    causal = mask_lib.CausalMask((64, 64))
    for mask in ([causal, mask_lib.CausalMask((64, 64), offset=3)],  # one per head
                 [causal, block_plan.WithoutIndexFunction(causal)],
                 [mask_lib.ChunkedCausalMask((64, 64), 16)],
                 [block_plan.WithoutIndexFunction(mask_lib.ChunkedCausalMask((64, 64), 16))],
                 [mask_lib.NumpyMask(np.tril(np.ones((64, 64), bool)))],
                 [mask_lib.LogicalOr(causal, causal)]):
        assert block_plan.band(mask_lib.MultiHeadMask(mask), 16, 16) is None


@pytest.mark.parametrize("blocks", [(24, 16), (16, 0), (16, 48)])
def test_blocks_that_do_not_divide_are_refused(blocks):
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((64, 64))])
    with pytest.raises(ValueError, match="should divide"):
        block_plan.band(mask, *blocks)

