"""Case 01's kernel entries refuse bad arguments by name before anything is traced: the
dtypes, shapes, scale layouts and masked_m values a reviewer tried."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kernels.moe_nvfp4 import mgpu_fused, mgpu_gemm, mgpu_quantize

E, M, K, N = 2, 128, 256, 256
U8, I32, F32 = np.uint8, np.int32, np.float32


def zeros(shape, dtype):
    return jnp.zeros(shape, dtype)


def quantize_args():
    return [zeros((E, M, K), jnp.bfloat16), zeros((E,), F32), jnp.array([64, 128], I32)]


def gemm_args():
    return [zeros((E, M, K // 2), U8), zeros((E, M, K // 16), U8), zeros((E, K // 2, N), U8),
            zeros((E, K // 16, N), U8), zeros((E,), F32), jnp.array([64, 0], I32)]


def fused_args():
    return [zeros((E, M, K // 2), U8), zeros((E, M, K // 16), U8),
            zeros((E, K // 2, 2 * N), U8), zeros((E, K // 16, 2 * N), U8), zeros((E,), F32),
            zeros((E,), F32), jnp.array([64, 0], I32)]


ENTRIES = {
    "quantize": (lambda: mgpu_quantize.make(E, M, K, mgpu_quantize.QuantizeConfig(64)),
                 quantize_args),
    "gemm": (lambda: mgpu_gemm.make(mgpu_gemm.Problem(E, M, N, K),
                                    mgpu_gemm.TuningConfig(64, 64, 2)), gemm_args),
    "fused": (lambda: mgpu_fused.make(E, M, N, K, mgpu_fused.FusedConfig()), fused_args),
}
BAD = [
    ("quantize", 0, lambda x: x.astype(jnp.float32), r"x: dtype float32; needs bfloat16"),
    ("quantize", 2, lambda x: jnp.array([64, 129], I32), r"masked_m: \[64, 129\]; needs each "
                                                         r"in \[0, 128\]"),
    ("quantize", 2, lambda x: jnp.array([-1, 0], I32), r"masked_m: \[-1, 0\]"),
    ("gemm", 0, lambda x: x.astype(jnp.int8), r"a: dtype int8; needs uint8"),
    ("gemm", 1, lambda x: zeros((E, M * K // 16), U8),
     r"a_scales: shape \(2, 2048\); needs \(2, 128, 16\) \(row-major .*128x4 layout"),
    ("gemm", 3, lambda x: x[:, :8], r"b_scales_t: shape \(2, 8, 256\); needs \(2, 16, 256\)"),
    ("gemm", 5, lambda x: x.astype(F32), r"masked_m: dtype float32"),
    ("fused", 1, lambda x: x.transpose(0, 2, 1), r"a1_scales: shape \(2, 16, 128\)"),
    ("fused", 5, lambda x: x[:1], r"a2_gs: shape \(1,\); needs \(2,\)"),
]


@pytest.mark.parametrize(("entry", "index", "change", "message"), BAD,
                         ids=[f"{e}-{m.split(':')[0]}" for e, _, _, m in BAD])
def test_a_bad_argument_is_named(entry, index, change, message):
    make, args = ENTRIES[entry]
    values = args()
    values[index] = change(values[index])
    with pytest.raises(ValueError, match=message):
        make()(*values)


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_missing_argument_is_named(entry):
    make, args = ENTRIES[entry]
    with pytest.raises(ValueError, match=r"arguments; needs \d+: "):
        make()(*args()[:-1])
