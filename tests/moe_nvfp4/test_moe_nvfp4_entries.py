"""Case 01's kernel entries refuse bad arguments by name before anything is traced: the
dtypes, shapes, scale layouts and masked_m values a reviewer tried."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kernels.moe_nvfp4 import inputs, mgpu_fused, mgpu_gemm, mgpu_quantize, port

pytestmark = pytest.mark.host_rehearsal

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


WHOLE_PATHS = ["moe_fused", "moe_unfused"]
# (input, change, message): what a reviewer would try at the whole path's entry.
BAD_PATH_INPUTS = {
    "hidden_bf16 float32": ("hidden_bf16", lambda x: x.astype(F32),
                            r"^hidden_bf16: dtype float32; needs bfloat16$"),
    "w2_t int8 codes": ("w2_t", lambda x: x.astype(jnp.int8),
                        r"^w2_t: dtype int8; needs uint8 \(layouts\.k_pair_major"),
    "w2_t_scales transposed": ("w2_t_scales", lambda x: x.transpose(0, 2, 1),
                               r"^w2_t_scales: shape \(2, 256, 16\); needs \(2, 16, 256\) "
                               r"\(layouts\.k_pair_major"),
    "a2_gs per row": ("a2_gs", lambda x: zeros((E, M), F32),
                      r"^a2_gs: shape \(2, 128\); needs \(2,\)$"),
    "masked_m over m": ("masked_m", lambda x: jnp.array([64, 129], I32),
                        r"^masked_m: \[64, 129\]; needs each in \[0, 128\]$"),
    "masked_m negative": ("masked_m", lambda x: jnp.array([-1, 0], I32),
                          r"^masked_m: \[-1, 0\]; needs each in \[0, 128\]$"),
}


@pytest.fixture
def untraceable(monkeypatch):
    """The variants' kernels replaced by ones that fail the test when called."""
    made = port.kernels

    def fail(*args):
        pytest.fail("a kernel was called before the path's inputs were checked")

    monkeypatch.setattr(port, "kernels", lambda *args, **kwargs: {
        stage: (fail, config, shapes)
        for stage, (_, config, shapes) in made(*args, **kwargs).items()})


def path_inputs():
    """Good inputs of the whole path, by name (zeros, masked_m included)."""
    return {name: zeros(shape.shape, shape.dtype)
            for name, shape in zip(port.INPUTS, port.input_shapes(E, M, K, N),
                                   strict=True)}


@pytest.mark.parametrize("variant", WHOLE_PATHS)
@pytest.mark.parametrize("case", list(BAD_PATH_INPUTS))
def test_a_bad_whole_path_input_is_named_before_any_kernel_runs(untraceable, variant, case):
    name, change, message = BAD_PATH_INPUTS[case]
    values = path_inputs()
    values[name] = change(values[name])
    path = port.function(port.VARIANTS[variant], E, M, K, N)
    with pytest.raises(ValueError, match=message):
        path(*values.values())


def test_the_cases_inputs_pass_the_whole_path_check():
    """What ``inputs.make`` hands every variant has the shapes the path checks for (hidden
    and inter apart, so no two dims can be swapped unnoticed)."""
    params = {"experts": 2, "m": 128, "hidden": 512, "inter": 256}
    given = inputs.make(params, np.random.default_rng(0))
    wants = port.input_shapes(*inputs.sizes(params))
    for name, want in zip(port.INPUTS, wants, strict=True):
        assert (given[name].shape, given[name].dtype) == (want.shape, want.dtype), name
