"""The masked grouped NVFP4 GEMM kernel in the Mosaic GPU interpreter (race detection on,
outputs poisoned with NaN) against the float64 model, and lowered for sm_90a.

Bit-exact condition (checked on every draw by ``oracle_f64.sum_is_exact_in_f32``): random
codes with e4m3 scales in [1, 2) and K <= 512 keep every partial sum an integer multiple
of the smallest product's quantum below 2**24 of it, so the kernel's f32 accumulator
holds the exact sum in any order; the kernel's output is then bf16(f32(alpha * sum)),
bit for bit. With general scales only the summation order differs: the bound is the
bf16 rounding of the output (half an ulp: 2**-8 relative) plus f32 accumulation,
K * 2**-24 * alpha * sum |products|.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kernels import mgpu_interpret, mgpu_lowering
from kernels.moe_nvfp4 import layouts, mgpu_gemm, mgpu_mainloop, numerics, oracle_f64, problems

pytestmark = [pytest.mark.interpret, pytest.mark.compile, pytest.mark.host_rehearsal]

CONFIGS = [mgpu_gemm.TuningConfig(64, 64, 2), mgpu_gemm.TuningConfig(128, 128, 3),
           mgpu_gemm.TuningConfig(64, 128, 1, persistent_ctas=3)]
IDS = [f"m{c.block_m}n{c.block_n}s{c.stages}p{c.persistent_ctas}" for c in CONFIGS]


def run(interp, problem, config, a, b, alpha, masked):
    b_t, sb_t = layouts.k_pair_major(b[0], b[1])
    out = mgpu_gemm.make(problem, config, interpret=interp)(a[0], a[1], b_t, sb_t, alpha, masked)
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    return np.asarray(out).astype(np.float64)


def check_untouched(out, masked):
    valid = oracle_f64.valid_rows(masked, out.shape[1])
    assert np.isnan(out[~valid]).all(), "a row past masked_m was written"
    assert not np.isnan(out[valid]).any(), "a valid row holds NaN"
    return valid


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_gemm_is_bit_exact_where_the_model_says_the_sum_is_exact(rng, interpreter, config):
    problem = mgpu_gemm.Problem(2, 128, 128, 256)
    a = problems.quantized(rng, 2, problem.m, problem.k, exact=True)
    b = problems.quantized(rng, 2, problem.n, problem.k, exact=True)
    assert oracle_f64.sum_is_exact_in_f32(a[0], a[1], b[0], b[1])
    masked = np.array([rng.integers(65, 128), 0], np.int32)[rng.permutation(2)]
    alpha = rng.uniform(0.1, 2, 2).astype(np.float32)
    out = run(interpreter, problem, config, a, b, alpha, masked)
    valid = check_untouched(out, masked)
    want = oracle_f64.masked_gemm(a[0], a[1], b[0], b[1], alpha, masked)
    want = want.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(out[valid], want[valid])


@pytest.mark.timeout(300)
def test_gemm_with_general_scales_is_within_its_rounding_bound(rng, interpreter):
    problem = mgpu_gemm.Problem(3, 64, 64, 512)
    a = problems.quantized(rng, 3, problem.m, problem.k)
    b = problems.quantized(rng, 3, problem.n, problem.k)
    masked = rng.permutation(np.array([64, 0, rng.integers(1, 64)], np.int32))
    alpha = (1 / (a[2].astype(np.float64) * b[2])).astype(np.float32)
    out = run(interpreter, problem, CONFIGS[0], a, b, alpha, masked)
    valid = check_untouched(out, masked)
    want = oracle_f64.masked_gemm(a[0], a[1], b[0], b[1], alpha, masked)
    da, db = numerics.dequantize(a[0], a[1]), numerics.dequantize(b[0], b[1])
    magnitude = np.einsum("emk,enk->emn", np.abs(da), np.abs(db)) * alpha[:, None, None]
    bound = 2.0**-8 * np.abs(want) + problem.k * 2.0**-24 * magnitude * 1.01
    assert np.all(np.abs(out - want)[valid] <= bound[valid])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_gemm_lowers_for_sm90a_at_an_upstream_benchmark_shape(config):
    problem = mgpu_gemm.Problem(6, 1408, 4096, 7168)  # groups 6, expected_m 1024 (×1.3)
    (launch,) = mgpu_lowering.lower_for_cuda(mgpu_gemm.make(problem, config),
                                        mgpu_gemm.arg_shapes(problem))["launches"]
    tiles = [1408 // config.block_m, 4096 // config.block_n, 6]  # x fastest
    assert launch["grid"] == ([config.persistent_ctas, 1, 1] if config.persistent_ctas
                              else tiles)
    assert launch["block"] == [128, 1, 1]
    assert mgpu_gemm.smem_bytes(config) <= launch["dynamic_smem_bytes"] \
        <= mgpu_mainloop.SMEM_LIMIT_BYTES


def test_over_budget_configs_are_rejected_naming_them():
    config = mgpu_gemm.TuningConfig(128, 256, 3)
    named = r"TuningConfig\(block_m=128, block_n=256, stages=3, .*exceed"
    with pytest.raises(ValueError, match=named):
        mgpu_gemm.make(mgpu_gemm.Problem(1, 128, 256, 256), config)
