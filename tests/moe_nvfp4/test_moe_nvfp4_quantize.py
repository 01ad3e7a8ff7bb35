"""The grouped NVFP4 quantize kernel in the Mosaic GPU interpreter (race detection on)
against the model, code for code with a tie-aware check, and lowered for sm_90a."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import mgpu_interpret, mgpu_lowering
from kernels.moe_nvfp4 import checks, mgpu_quantize, numerics, oracle_f64, problems

pytestmark = [pytest.mark.interpret, pytest.mark.compile, pytest.mark.host_rehearsal]

POISON = 0xFF  # the interpreter's uninitialised uint8


def test_tie_aware_check_rejects_a_wrong_code_and_a_wrong_scale(rng):
    x = problems.activations(rng, 1, 4, 64)
    gs = problems.global_scale(x)
    packed, scales = numerics.quantize(x, gs)
    every = np.ones((1, 4), bool)
    assert checks.tie_aware(x, gs, packed, scales, every)["passed"]
    bad = packed.copy()
    bad[0, 0, 0] ^= 0x22  # two codes moved by two steps
    assert checks.tie_aware(x, gs, bad, scales, every)["code_mismatches"] >= 1
    bad_scales = scales.copy()
    bad_scales[0, 0, 0] += 2
    assert checks.tie_aware(x, gs, packed, bad_scales, every)["scale_mismatches"] == 16


CONFIGS = [mgpu_quantize.QuantizeConfig(64), mgpu_quantize.QuantizeConfig(128),
           mgpu_quantize.QuantizeConfig(128, "swizzled_128x4")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", CONFIGS, ids=[f"m{c.block_m}-{c.scale_layout}"
                                                 for c in CONFIGS])
def test_quantize_matches_the_model_code_for_code_up_to_ties(rng, interpreter, config):
    e, m, k = 2, 256, 512
    x = problems.activations(rng, e, m, k)
    x[0, 0, :16] = -x[0, 0, :16] * 1e-3  # small negatives beside a large one: −0 codes
    x[0, 0, 0] = 1.0
    gs = problems.global_scale(x)
    masked = rng.permutation(np.array([rng.integers(1, 129), 0], np.int32))
    fn = mgpu_quantize.make(e, m, k, config, interpreter)
    packed, scales = map(np.asarray, fn(jnp.asarray(x, jnp.bfloat16), gs, masked))
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    swizzled = config.scale_layout == "swizzled_128x4"
    if swizzled:
        assert scales.shape == numerics.swizzle(np.zeros((e, m, k // 16), np.uint8)).shape
        scales = numerics.unswizzle(scales, m, k // 16)
    valid = oracle_f64.valid_rows(masked, m)
    result = checks.tie_aware(x, gs, packed, scales, valid)
    assert result["passed"], result
    unwritten = ~valid  # poisoned by the interpreter: never written
    assert (packed[unwritten] == POISON).all()
    # Row-major scales: rows past masked_m untouched; 128x4: whole atoms past it untouched.
    untouched = unwritten if not swizzled else ~oracle_f64.valid_rows(-(-masked // 128) * 128, m)
    assert (scales[untouched] == POISON).all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", CONFIGS[1:], ids=lambda c: c.scale_layout)
def test_quantize_lowers_for_sm90a_at_an_upstream_benchmark_shape(config):
    e, m, k = 6, 1408, 7168
    fn = mgpu_quantize.make(e, m, k, config)
    (launch,) = mgpu_lowering.lower_for_cuda(fn, (jax.ShapeDtypeStruct((e, m, k), jnp.bfloat16),
                                             jax.ShapeDtypeStruct((e,), jnp.float32),
                                             jax.ShapeDtypeStruct((e,), jnp.int32)))["launches"]
    assert launch["grid"] == [m // 128, e, 1] and launch["block"] == [128, 1, 1]


def _store_kernel(width: int, staged: bool):
    """One CTA storing a [64, width] uint8 tile's valid rows, as the kernels do."""
    from jax.experimental import pallas as pl  # noqa: F401  (plgpu needs pallas loaded)
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernels.moe_nvfp4 import mgpu_mainloop as loop

    def body(rows_ref, out_ref, tile, staging=None):
        tile[...] = jnp.zeros((64, width), jnp.uint8)
        plgpu.commit_smem()
        loop.store_valid_rows(tile, out_ref, 0, 0, 0, rows_ref[0], 64, width, staging)
        plgpu.wait_smem_to_gmem(0)

    scratch = {"tile": plgpu.SMEM((64, width), jnp.uint8)}
    if staged:
        scratch["staging"] = loop.row_staging(64, width, jnp.uint8)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((1, 64, width), jnp.uint8),
                        grid=(1,), grid_names=("x",), scratch_types=scratch)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("width", [16, 64])
def test_rows_narrower_than_tma_alignment_are_staged_or_refused(width):
    """An H200 raised "misaligned address" when 64- and 16-byte rows of a partial block
    went one by one by TMA from the tile itself: such a store is refused at trace time,
    and lowers with a staging buffer of one 128-byte unit per row."""
    from kernels.moe_nvfp4 import mgpu_mainloop as loop

    shapes = (jax.ShapeDtypeStruct((1,), jnp.int32),)
    with pytest.raises(ValueError, match="128-byte aligned"):
        mgpu_lowering.lower_for_cuda(_store_kernel(width, staged=False), shapes)
    (launch,) = mgpu_lowering.lower_for_cuda(_store_kernel(width, staged=True), shapes)["launches"]
    assert launch["dynamic_smem_bytes"] >= 64 * width + 64 * loop.TMA_SMEM_ALIGN
    assert loop.row_staging(64, 64, jnp.bfloat16) is None  # 128-byte rows need none
