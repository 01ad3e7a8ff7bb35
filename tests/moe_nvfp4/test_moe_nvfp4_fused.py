"""The fused GEMM1 + SiLU·mul + requantize kernel, and the whole path (quantize ->
fused -> GEMM2), in the Mosaic GPU interpreter (race detection on, outputs poisoned)
against the float64 model, and lowered for sm_90a.

The fused kernel's act comes from an f32 GEMM, so its codes are checked tie-aware with
the model's own error bound on act (``oracle_f64.f32_gemm_error`` through
``silu_mul_error``): a code may differ from the float64 model's only where act's exact
value is within that bound of a rounding boundary. The final output is checked against
float64 GEMM2 of the kernel's own stage-3 codes, to bf16 precision: half an ulp of the
bf16 output (2**-8 relative) plus the f32 accumulation bound.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kernels import mgpu_interpret, mgpu_lowering
from kernels.moe_nvfp4 import (
    checks,
    layouts,
    mgpu_fused,
    mgpu_gemm,
    mgpu_mainloop,
    mgpu_quantize,
    numerics,
    oracle_f64,
    problems,
)

pytestmark = [pytest.mark.interpret, pytest.mark.compile, pytest.mark.host_rehearsal]

POISON = 0xFF  # the interpreter's uninitialised uint8


def moe_problem(rng, e, m, n, k):
    """Hidden states, NVFP4 weights, global scales, masked_m: one random MoE layer."""
    hidden = problems.activations(rng, e, m, k)
    w1 = problems.quantized(rng, e, 2 * n, k)
    w2 = problems.quantized(rng, e, k, n)
    masked = rng.permutation(np.array([rng.integers(1, m + 1), 0, m][:e], np.int32))
    a1_gs = problems.global_scale(hidden)
    a1 = numerics.quantize(hidden, a1_gs)
    alpha1 = (1 / (a1_gs.astype(np.float64) * w1[2])).astype(np.float32)
    h = oracle_f64.masked_gemm(*a1, w1[0], w1[1], alpha1, masked)
    a2_gs = problems.global_scale(np.nan_to_num(oracle_f64.silu_mul(h)))
    alpha2 = (1 / (a2_gs.astype(np.float64) * w2[2])).astype(np.float32)
    return dict(hidden=hidden, w1=w1, w2=w2, masked=masked, a1_gs=a1_gs, a1=a1,
                alpha1=alpha1, h=h, a2_gs=a2_gs, alpha2=alpha2)


def gemm_error(a_packed, a_scales, b_packed, b_scales, alpha):
    """The model's f32 accumulation bound of a masked GEMM with per-expert alpha."""
    a, b = (np.abs(numerics.dequantize(x, s)) for x, s in ((a_packed, a_scales),
                                                         (b_packed, b_scales)))
    return oracle_f64.f32_gemm_error(a, b) * np.abs(alpha)[:, None, None]


def check_stage3(p, a2_packed, a2_scales):
    """Tie-aware check of the requantized act on valid rows; unwritten rows poisoned."""
    valid = oracle_f64.valid_rows(p["masked"], a2_packed.shape[1])
    h_error = gemm_error(*p["a1"], p["w1"][0], p["w1"][1], p["alpha1"])
    act = np.nan_to_num(oracle_f64.silu_mul(p["h"]))
    act_error = oracle_f64.silu_mul_error(np.nan_to_num(p["h"]), h_error)
    result = checks.tie_aware(act, p["a2_gs"], a2_packed, a2_scales, valid, act_error)
    assert result["passed"], result
    assert (a2_packed[~valid] == POISON).all() and (a2_scales[~valid] == POISON).all()
    return valid


@pytest.mark.timeout(300)
def test_fused_kernel_requantizes_silu_mul_of_gemm1(rng, interpreter):
    e, m, n, k = 3, 64, 256, 256
    p = moe_problem(rng, e, m, n, k)
    w1_t, sw1_t = layouts.fused_w1(p["w1"][0], p["w1"][1])
    fused = mgpu_fused.make(e, m, n, k, mgpu_fused.FusedConfig(), interpret=interpreter)
    packed, scales = map(np.asarray, fused(*p["a1"], w1_t, sw1_t, p["alpha1"], p["a2_gs"],
                                           p["masked"]))
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    check_stage3(p, packed, scales)


@pytest.mark.timeout(400)
def test_whole_path_matches_float64_to_bf16_precision(rng, interpreter):
    e, m, n, k = 2, 64, 256, 256
    p = moe_problem(rng, e, m, n, k)
    quantize = mgpu_quantize.make(e, m, k, mgpu_quantize.QuantizeConfig(64), interpreter)
    fused = mgpu_fused.make(e, m, n, k, mgpu_fused.FusedConfig(), interpret=interpreter)
    gemm2 = mgpu_gemm.make(mgpu_gemm.Problem(e, m, k, n), mgpu_gemm.TuningConfig(64, 64, 2),
                           interpret=interpreter)
    a1 = quantize(jnp.asarray(p["hidden"], jnp.bfloat16), p["a1_gs"], p["masked"])
    a2 = fused(*a1, *layouts.fused_w1(p["w1"][0], p["w1"][1]), p["alpha1"], p["a2_gs"],
               p["masked"])
    out = gemm2(*a2, *layouts.k_pair_major(p["w2"][0], p["w2"][1]), p["alpha2"], p["masked"])
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    a2 = tuple(map(np.asarray, a2))
    # Stage 1 must agree with the model's quantization (tie-aware) for stage 3's check.
    a1 = tuple(map(np.asarray, a1))
    valid = oracle_f64.valid_rows(p["masked"], m)
    result = checks.tie_aware(p["hidden"], p["a1_gs"], *a1, valid)
    assert result["passed"], result
    for given, got in zip(p["a1"], a1, strict=True):  # stage 3 is checked on these codes
        given[valid] = got[valid]
    p["h"] = oracle_f64.masked_gemm(*p["a1"], p["w1"][0], p["w1"][1], p["alpha1"], p["masked"])
    valid = check_stage3(p, *a2)
    out = np.asarray(out).astype(np.float64)
    want = oracle_f64.masked_gemm(*a2, p["w2"][0], p["w2"][1], p["alpha2"], p["masked"])
    bound = (2.0**-8 * np.abs(want)
             + gemm_error(*a2, p["w2"][0], p["w2"][1], p["alpha2"]))
    assert np.isnan(out[~valid]).all(), "a row past masked_m was written"
    assert np.all(np.abs(out - want)[valid] <= bound[valid])


# About 50 s under jax 0.11.2 (Mosaic GPU's layout inference), 13 s under 0.10.2; a
# rehearsal beside other CPU work took more than 120 s.
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("n", "k"), [(2048, 7168), (3584, 2048)])  # GEMM1 n = 2N
def test_fused_lowers_for_sm90a_at_upstream_benchmark_shapes(n, k):
    fn = mgpu_fused.make(6, 1408, n, k, mgpu_fused.FusedConfig())
    (launch,) = mgpu_lowering.lower_for_cuda(fn, mgpu_fused.arg_shapes(6, 1408, n, k)
                                             )["launches"]
    assert launch["grid"] == [1408 // 64, n // 256, 6]
    assert mgpu_fused.smem_bytes(mgpu_fused.FusedConfig()) <= launch["dynamic_smem_bytes"] \
        <= mgpu_mainloop.SMEM_LIMIT_BYTES


def test_fused_over_budget_is_rejected_naming_the_config():
    with pytest.raises(ValueError,
                       match=r"FusedConfig\(block_m=64, stages=3, produce_scales=True\).*exceed"):
        mgpu_fused.make(1, 64, 256, 256, mgpu_fused.FusedConfig(stages=3))
