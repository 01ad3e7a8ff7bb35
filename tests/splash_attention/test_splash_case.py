"""Case 02 plug-in: the upstream kernel, the port (forward and backward) and baselines
against the float64 oracle, through the surface the pipeline calls."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from casebook.core import cases, config
from casebook.stages.verify import compare
from kernels import contract
from kernels.splash_attention import upstream

pytestmark = [pytest.mark.interpret, pytest.mark.host_rehearsal]

splash = cases.load("splash_attention")

POINTS = {
    "mha_causal_f32": {"heads_q": 2, "heads_kv": 2, "seq_len": 256, "head_dim": 64,
                       "mask": {"kind": "causal"}, "dtype": "float32"},
    "gqa_local_bf16": {"heads_q": 4, "heads_kv": 2, "seq_len": 384, "head_dim": 64,
                       "mask": {"kind": "local", "window": [100, 20]}, "dtype": "bfloat16"},
}
PORT_POINTS = {
    "mha_causal_f16": {**POINTS["mha_causal_f32"], "dtype": "float16"},
    "gqa_local_bf16": POINTS["gqa_local_bf16"],
}
PACKED = {"heads_q": 2, "heads_kv": 1, "seq_len": 256, "head_dim": 64,
          "mask": {"kind": "causal"}, "dtype": "float16", "segments": 3, "soft_cap": 2.0}


def run(runnable, inputs):
    return runnable.fetch(runnable.call(*runnable.prepare(inputs)))


def check(params, inputs, got, want, output="out"):
    """The case's own check: each element within its bound, plus the shipped atol and
    rtol (the output's rounding)."""
    atol, rtol = config.shipped_tolerance("splash_attention", params["dtype"], output)
    return splash.compare(params, inputs, output, np.asarray(got), want,
                          {"atol": atol, "rtol": rtol})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("purpose", ["check", "time"])
@pytest.mark.parametrize("name", sorted(POINTS))
def test_upstream_kernel_matches_the_oracle(rng, name, purpose):
    params = POINTS[name]
    inputs = splash.make_inputs(params, rng)
    splash.reset()
    out = run(splash.kernel("upstream", params, purpose), inputs)
    result = check(params, inputs, out, splash.oracle(params, inputs)["out"])
    assert result["passed"], result
    assert not splash.races_found()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("purpose", ["check", "time"])
@pytest.mark.parametrize("variant", ["mgpu", "mgpu_mask_tiles"])
@pytest.mark.parametrize("name", sorted(PORT_POINTS))
def test_port_runs_through_the_plugin_and_matches_the_oracle(rng, name, variant, purpose):
    params = PORT_POINTS[name]
    inputs = splash.make_inputs(params, rng)
    splash.reset()
    runnable = splash.kernel(variant, params, purpose)
    assert runnable.execution["interpret"]
    assert "Mosaic GPU interpret mode" in runnable.execution["mode"]
    assert runnable.execution["race_detection"] == (purpose == "check")
    out = run(runnable, inputs)
    result = check(params, inputs, out, splash.oracle(params, inputs)["out"])
    assert result["passed"], result
    assert not splash.races_found()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["mgpu_bwd", "upstream_bwd"])
@pytest.mark.parametrize("name", ["gqa_local_bf16", "packed"])
def test_backward_variants_return_gradients_that_match_the_oracle(rng, name, variant):
    params = PACKED if name == "packed" else PORT_POINTS[name]
    inputs = splash.make_inputs(params, rng)
    splash.reset()
    runnable = splash.kernel(variant, params, "check")
    assert runnable.execution["race_detection"]
    got = run(runnable, inputs)
    want = splash.oracle(params, inputs)
    assert sorted(got) == ["dk", "dq", "dv"]
    for output, value in got.items():
        result = check(params, inputs, value, want[output], output)
        assert result["passed"], (output, result)
    assert not splash.races_found()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["upstream", "mgpu"])
def test_segment_ids_and_soft_cap_as_point_params(rng, variant):
    """A point that packs 3 sequences and caps logits: the oracle honours both, and so
    must the kernels (the oracle without them would differ far beyond tolerance)."""
    inputs = splash.make_inputs(PACKED, rng)
    splash.reset()
    out = run(splash.kernel(variant, PACKED, "check"), inputs)
    want = splash.oracle(PACKED, inputs)["out"]
    assert check(PACKED, inputs, out, want)["passed"]
    plain = splash.oracle({**PACKED, "segments": None, "soft_cap": None}, inputs)["out"]
    assert not check(PACKED, inputs, plain, want)["passed"]
    assert not splash.races_found()


@pytest.mark.parametrize("variant", ["mgpu", "mgpu_bwd"])
def test_the_port_runs_for_real_on_an_sm90_gpu_and_nowhere_else(monkeypatch, variant):
    """On a Hopper host the pipeline gets the real kernel, never the interpreter (whose
    times would say nothing about the GPU); on another GPU the port is not runnable."""
    gpu = SimpleNamespace(platform="gpu", compute_capability="9.0", device_kind="NVIDIA H200")
    monkeypatch.setattr(jax, "devices", lambda *args: [gpu])
    for purpose in ("check", "time"):
        runnable = splash.kernel(variant, PORT_POINTS["mha_causal_f16"], purpose)
        assert not runnable.execution["interpret"]
        assert runnable.execution["mode"] == "Pallas Mosaic GPU kernel on NVIDIA H200 (sm_90a)"
    gpu.compute_capability, gpu.device_kind = "10.0", "NVIDIA B200"
    with pytest.raises(contract.NotRunnable, match=r"B200 has compute capability 10\.0"):
        splash.kernel(variant, PORT_POINTS["mha_causal_f16"], "check")


def test_a_baseline_without_soft_cap_is_not_runnable_at_such_a_point():
    with pytest.raises(contract.NotRunnable, match="soft cap"):
        splash.baseline("xla_dot_product_attention", PACKED)


@pytest.mark.parametrize(("params", "why"), [
    (PORT_POINTS["mha_causal_f16"], "needs an sm_90 GPU; this host has none"),
    (POINTS["gqa_local_bf16"], "no local mask"),
    (POINTS["mha_causal_f32"], "needs f16/bf16"),
    (PACKED, "no segment ids or logit soft cap")])
def test_upstream_attention_mgpu_says_why_it_cannot_run(params, why):
    """On this CPU host every point is refused, with the first reason that applies."""
    with pytest.raises(contract.NotRunnable, match=why):
        splash.baseline("attention_mgpu", params)


@pytest.mark.parametrize(("params", "why"), [
    (PORT_POINTS["mha_causal_f16"], "cuDNN attention needs an NVIDIA GPU; this host has none"),
    (POINTS["gqa_local_bf16"], "left window only"),
    (POINTS["mha_causal_f32"], "needs f16/bf16"),
    (PACKED, "no logit soft cap"),
    ({**PORT_POINTS["mha_causal_f16"], "segments": 2}, "not segment ids")])
def test_cudnn_attention_says_why_it_cannot_run(params, why):
    with pytest.raises(contract.NotRunnable, match=why):
        splash.baseline("cudnn_dot_product_attention", params)


def test_cudnn_attention_asks_jax_for_cudnn_on_a_gpu(monkeypatch, rng):
    """On a GPU backend the baseline calls jax.nn with implementation='cudnn' (faked here:
    the call is recorded and answered by the XLA implementation)."""
    calls = []
    real = jax.nn.dot_product_attention

    def recording(*args, implementation=None, **kwargs):
        calls.append({"implementation": implementation, **kwargs})
        return real(*args, **kwargs)

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
    params = {**POINTS["gqa_local_bf16"], "mask": {"kind": "local", "window": [100, 0]}}
    runnable = splash.baseline("cudnn_dot_product_attention", params)
    assert runnable.execution["mode"].startswith("cuDNN flash attention")
    inputs = splash.make_inputs(params, rng)
    got = run(runnable, inputs)
    assert calls[-1]["implementation"] == "cudnn"
    assert calls[-1]["local_window_size"] == (100, 0) and not calls[-1]["is_causal"]
    assert check(params, inputs, got, splash.oracle(params, inputs)["out"])["passed"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "baseline"), [
    (name, baseline) for name in sorted({**POINTS, **PORT_POINTS, "packed": PACKED})
    for baseline in ("dense_masked", "xla_dot_product_attention")
    # jax.nn has no soft cap: that pair raises NotRunnable (tested above).
    if (name, baseline) != ("packed", "xla_dot_product_attention")])
def test_baselines_match_the_oracle(rng, name, baseline):
    params = {**POINTS, **PORT_POINTS, "packed": PACKED}[name]
    inputs = splash.make_inputs(params, rng)
    found = check(params, inputs, run(splash.baseline(baseline, params), inputs),
                  splash.oracle(params, inputs)["out"])
    assert found["passed"], found


@pytest.mark.timeout(120)
def test_checking_mode_poisons_what_a_kernel_forgets_to_write():
    """A kernel that writes only half its output leaves NaN behind, and fails."""

    def first_half_only(x_ref, o_ref):
        o_ref[:8] = x_ref[:8]

    x = jnp.ones((16, 128), jnp.float32)
    out = pl.pallas_call(
        first_half_only, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=upstream.checking_mode())(x)
    out = np.asarray(out)
    assert np.isnan(out[8:]).all() and (out[:8] == 1).all()
    assert not compare(out, np.ones(x.shape), atol=1, rtol=1)["passed"]


@pytest.mark.timeout(120)
def test_build_lowers_for_tpu_and_counts_blocks():
    params = {**POINTS["gqa_local_bf16"], "block": 128}
    built = splash.build("upstream", params)
    tpu = next(a for a in built["artifacts"] if a["target"] == "tpu")
    assert tpu["facts"]["mosaic_custom_calls"] >= 1
    census = built["block_census"]
    blocks = params["seq_len"] // 128
    assert sum(census.values()) == built["block_table_heads"] * blocks * blocks
    assert census["empty"] > 0  # a local window leaves far-away blocks empty


def test_inputs_are_fresh_and_typed(rng):
    params = POINTS["gqa_local_bf16"]
    a, b = splash.make_inputs(params, rng), splash.make_inputs(params, rng)
    assert a["q"].shape == (4, 384, 64) and a["k"].shape == (2, 384, 64)
    assert str(a["q"].dtype) == "bfloat16"
    assert not np.array_equal(a["q"], b["q"])


def test_impossible_problems_are_named():
    point = POINTS["mha_causal_f32"]
    key, why = splash.check_params({**point, "heads_q": 3})
    assert key == "heads_kv" and "multiple of heads_kv" in why
    assert splash.check_params({**point, "segments": 2 * point["seq_len"]})[0] == "segments"
    assert splash.check_params(point) is None
