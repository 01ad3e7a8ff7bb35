"""The NVFP4 numerics model: roundings against ml_dtypes' single roundings, exhaustive
exactness claims, layout bijection and the masked MoE's semantics."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kernels.moe_nvfp4 import numerics, oracle_f64, problems

F32 = st.floats(-16, 16, width=32, allow_subnormal=True)
E4M3_FINITE = [b for b in range(256) if np.isfinite(numerics.e4m3_value(np.uint8(b)))]


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, 64, elements=F32))
def test_e2m1_code_is_the_single_rounding_of_ml_dtypes(x):
    want = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    np.testing.assert_array_equal(numerics.e2m1_code(x), want)


def test_e2m1_ties_go_to_the_even_code():
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 7.0])
    np.testing.assert_array_equal(numerics.e2m1_code(ties),
                                  [0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x8, 0xE, 0x7])


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, 64, elements=st.floats(0, 500, width=32)))
def test_e4m3_rounding_is_the_single_rounding_of_ml_dtypes(v):
    want = np.minimum(v, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(numerics.round_e4m3(v), want)


def test_every_e2m1_times_e4m3_product_is_exact_in_bf16_and_f16():
    products = np.array([numerics.E2M1_VALUES[c] * numerics.e4m3_value(np.uint8(s))
                         for c, s in itertools.product(range(16), E4M3_FINITE)])
    assert products.size == 16 * 254 == 4064
    for dtype in (ml_dtypes.bfloat16, np.float16):
        np.testing.assert_array_equal(products.astype(dtype).astype(np.float64), products)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 3))
def test_scale_layout_is_a_bijection_matching_the_offset_formula(m, k_blocks, e):
    scales = np.random.default_rng(m * k_blocks).integers(
        1, 256, (e, m, k_blocks)).astype(np.uint8)
    flat = numerics.swizzle(scales)
    assert flat.shape == (e, -(-m // 128) * -(-k_blocks // 4) * 512)
    np.testing.assert_array_equal(numerics.unswizzle(flat, m, k_blocks), scales)
    rows, cols = np.meshgrid(np.arange(m), np.arange(k_blocks), indexing="ij")
    offsets = numerics.swizzled_offset(rows, cols, k_blocks)
    np.testing.assert_array_equal(flat[:, offsets], scales)
    assert len(np.unique(offsets)) == m * k_blocks  # injective
    assert np.count_nonzero(flat) == scales.size  # padding is zero


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_quantize_round_trips_values_on_the_grid(seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (2, 8, 64), dtype=np.uint8)
    codes[..., ::16] = rng.choice([0x7, 0xF], codes[..., ::16].shape)  # each block: ±6
    sf = numerics.round_e4m3(rng.uniform(2**-6, 448, (2, 8, 4)))
    gs = rng.uniform(0.5, 4, 2).astype(np.float32)
    x = numerics.dequantize(numerics.pack(codes), numerics.e4m3_bits(sf), gs)
    packed, scales = numerics.quantize(x, gs)
    np.testing.assert_array_equal(numerics.unpack(packed), codes)
    np.testing.assert_array_equal(numerics.e4m3_value(scales), sf)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_quantize_picks_the_nearest_code_for_its_scale(seed):
    x = problems.activations(np.random.default_rng(seed), 2, 4, 64)
    gs = problems.global_scale(x)
    packed, scales = numerics.quantize(x, gs)
    sf = numerics.e4m3_value(scales)
    np.testing.assert_array_equal(sf, numerics.round_e4m3(numerics.block_scale(x, gs)))
    y = np.clip(numerics.scaled_value(x, gs, sf), -6, 6)
    got = numerics.e2m1_value(numerics.unpack(packed))
    distance = np.abs(y[..., None] - numerics.E2M1_VALUES[:8] * np.sign(y)[..., None]).min(-1)
    np.testing.assert_array_equal(np.abs(y - got), distance)
    assert sf.max() <= 448 and np.all(np.abs(got) <= 6)


def test_small_negatives_are_minus_zero_and_zero_scales_give_zero_codes():
    x = np.zeros((1, 1, 32))
    x[0, 0, :16] = [6.0] + [-0.01] * 15
    x[0, 0, 16:] = -1e-30  # scale rounds to 0
    packed, scales = numerics.quantize(x, np.array([1.0]))
    codes = numerics.unpack(packed)[0, 0]
    assert codes[0] == 0x7 and set(codes[1:16]) == {0x8} and set(codes[16:]) == {0}
    assert scales[0, 0, 1] == 0


def test_masked_gemm_computes_valid_rows_only():
    rng = np.random.default_rng()
    a = problems.quantized(rng, 3, 8, 64)
    b = problems.quantized(rng, 3, 16, 64)
    masked = np.array([8, 0, 3])
    alpha = 1 / (a[2].astype(np.float64) * b[2])
    out = oracle_f64.masked_gemm(a[0], a[1], b[0], b[1], alpha, masked)
    da, db = numerics.dequantize(a[0], a[1], a[2]), numerics.dequantize(b[0], b[1], b[2])
    dense = np.einsum("emk,enk->emn", da, db)
    valid = oracle_f64.valid_rows(masked, 8)
    # Two float64 sums of the same 64 products, in any order, each scaled: they differ by
    # at most 2·(K+2)·2⁻⁵³ of the sum of the products' magnitudes, element by element (a
    # bound no cancellation in the sum can break, as a relative tolerance could).
    bound = 2 * (64 + 2) * 2.0**-53 * np.einsum("emk,enk->emn", np.abs(da), np.abs(db))
    assert (np.abs(out[valid] - dense[valid]) <= bound[valid]).all()
    assert np.isnan(out[~valid]).all() and valid.sum() == 11


def test_exactness_condition_holds_for_exact_problems_and_implies_f32_exactness():
    rng = np.random.default_rng()
    a = problems.quantized(rng, 2, 8, 256, exact=True)
    b = problems.quantized(rng, 2, 8, 256, exact=True)
    assert oracle_f64.sum_is_exact_in_f32(a[0], a[1], b[0], b[1])
    da, db = numerics.dequantize(a[0], a[1]), numerics.dequantize(b[0], b[1])
    products = (da[:, :, None, :] * db[:, None, :, :])[..., rng.permutation(256)]
    f32 = np.zeros(products.shape[:-1], np.float32)
    for i in range(256):  # a shuffled float32 accumulation order
        f32 += products[..., i].astype(np.float32)
    np.testing.assert_array_equal(f32, products.sum(-1))


def test_exactness_condition_fails_for_wide_scales():
    rng = np.random.default_rng()
    a = problems.quantized(rng, 1, 4, 512)
    b = problems.quantized(rng, 1, 4, 512)
    assert not oracle_f64.sum_is_exact_in_f32(a[0], a[1], b[0], b[1])


def test_moe_stages_chain_and_respect_masked_m():
    rng = np.random.default_rng()
    e, m, k, n = 3, 8, 64, 32
    hidden = problems.activations(rng, e, m, k)
    w1 = problems.quantized(rng, e, 2 * n, k)
    w2 = problems.quantized(rng, e, k, n)
    masked = np.array([5, 0, 8])
    a1_gs = problems.global_scale(hidden)
    h_ref = np.einsum("emk,enk->emn", hidden, numerics.dequantize(*w1))
    a2_gs = problems.global_scale(oracle_f64.silu_mul(h_ref))
    alpha1, alpha2 = 1 / (a1_gs.astype(np.float64) * w1[2]), 1 / (a2_gs * w2[2])
    got = oracle_f64.moe(hidden, a1_gs, w1[:2], alpha1, a2_gs, w2[:2], alpha2, masked)
    valid = oracle_f64.valid_rows(masked, m)
    assert got["out"].shape == (e, m, k) and np.isnan(got["out"][~valid]).all()
    np.testing.assert_array_equal(got["act"][~valid], 0)
    # The quantized path is the unquantized one within what its two quantizations allow:
    # each element moves by at most one e2m1 code unit times its block scale over gs
    # (half the widest code gap), which GEMM1, SiLU·mul and GEMM2 carry forward.
    def code_unit(scales, gs):
        return np.repeat(numerics.e4m3_value(scales), numerics.BLOCK, axis=-1) / gs[
            :, None, None]

    w1_abs, w2 = np.abs(numerics.dequantize(*w1)), numerics.dequantize(*w2)
    h_error = np.einsum("emk,enk->emn", code_unit(got["a1_scales"], a1_gs), w1_abs)
    act_error = (oracle_f64.silu_mul_error(h_ref, h_error)
                 + code_unit(got["a2_scales"], a2_gs))
    dense = np.einsum("emn,ekn->emk", oracle_f64.silu_mul(h_ref), w2)
    bound = np.einsum("emn,ekn->emk", act_error, np.abs(w2)) * (1 + 1e-9)
    assert np.all(np.abs(got["out"] - dense)[valid] <= bound[valid])


@pytest.mark.parametrize("shape", [(1, 128, 64), (2, 200, 48)])
def test_swizzle_pads_to_whole_atoms(shape):
    flat = numerics.swizzle(np.ones(shape, np.uint8))
    assert flat.shape[1] % 512 == 0


@pytest.mark.parametrize("seed", [21, 22])
def test_a_large_quantization_in_row_blocks_is_bit_for_bit_one_piece(monkeypatch, seed):
    """From PARALLEL_FROM elements rows are quantized in blocks on threads (the upstream
    benchmark's sizes); codes and scales are those of one piece, zero and −0 blocks and
    subnormal scales included."""
    rng = np.random.default_rng(seed)
    x = problems.activations(rng, 3, 37, 256)
    x[0, 3, :16], x[1, 5, 16:32], x[2, 7, 5] = 0, -0.0, np.float32(1e-30)
    gs = problems.global_scale(x)
    whole = numerics.quantize(x, gs)
    monkeypatch.setattr(numerics, "PARALLEL_FROM", 1)
    monkeypatch.setattr(numerics, "usable_cpus", lambda: 5)
    assert len(numerics.row_blocks(x)) == 5
    blocks = numerics.quantize(x, gs)
    for one, parts in zip(whole, blocks, strict=True):
        assert one.dtype == parts.dtype and np.array_equal(one, parts)


def test_the_float64_gemm_is_every_products_sum():
    """gemm_nt (BLAS) against an exact sum: integer-valued products, exact in float64."""
    rng = np.random.default_rng(23)
    a, b = rng.integers(-8, 8, (2, 5, 40)), rng.integers(-8, 8, (2, 7, 40))
    want = (a[:, :, None, :] * b[:, None, :, :]).sum(-1)
    got = oracle_f64.gemm_nt(a.astype(np.float32), b)
    assert got.dtype == np.float64 and np.array_equal(got, want)


def test_a_large_oracle_computed_expert_by_expert_is_bit_for_bit_the_batched_one(
        monkeypatch):
    """From PARALLEL_FROM hidden elements each expert's planes are computed on a thread
    of its own (every input is per expert): every plane as the batched computation's."""
    from kernels.moe_nvfp4 import inputs, oracle_planes

    params = {"experts": 3, "m": 128, "expected_m": 64, "hidden": 256, "inter": 256}
    given = inputs.make(params, np.random.default_rng(24))
    whole = oracle_planes.oracle(given)
    monkeypatch.setattr(numerics, "PARALLEL_FROM", 1)
    monkeypatch.setattr(numerics, "usable_cpus", lambda: 2)
    calls = []
    planes_of = oracle_planes._planes
    monkeypatch.setattr(oracle_planes, "_planes", lambda part: calls.append(
        part["hidden"].shape) or planes_of(part))
    split = oracle_planes.oracle(given)
    assert calls == [(1, 128, 256)] * 3
    assert whole.keys() == split.keys()
    for name, planes in whole.items():
        assert planes.shape == split[name].shape
        assert np.array_equal(planes, split[name], equal_nan=True), name
