"""Case 01 plug-in: variants, oracle planes, the case's compare, baselines, build."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from casebook.core import cases, config, paths
from casebook.stages import verify
from kernels.moe_nvfp4 import mgpu_quantize, numerics, port, upstream

pytestmark = [pytest.mark.interpret, pytest.mark.compile]

moe = cases.load("moe_nvfp4")
SPEC = config.load_case(paths.SOURCE_ROOT / "configs/cases", "moe_nvfp4")
POINT = SPEC["points"][0]["params"]


def tolerance(output):
    return config.tolerance(SPEC, "nvfp4", output, "moe_nvfp4.yaml")


def check(params, runnable, inputs):
    got = runnable.fetch(runnable.call(*runnable.prepare(inputs)))
    return got, verify.check_outputs(params, inputs, got, moe.oracle(params, inputs), tolerance,
                                     moe.compare)


def test_the_config_lists_every_variant_and_the_tie_window_it_states():
    assert sorted([*port.VARIANTS, upstream.VARIANT]) == sorted(
        v["name"] for v in SPEC["variants"])
    assert SPEC["tolerances"]["nvfp4"]["a1"]["rtol"] == numerics.TIE_WINDOW


@pytest.mark.parametrize(("stages", "why"), [
    ({"gemm1": port.tiles(64, 64, 2), "fused": port.mgpu_fused.FusedConfig()},
     "either unfused"),
    ({"quantize": mgpu_quantize.QuantizeConfig(), "gemm2": port.tiles(64, 64, 2)},
     "contiguous"),
    ({"gemm1": port.tiles(64, 64, 2), "gemm2": port.tiles(64, 64, 2)}, "quantize kernel"),
])
def test_a_variant_that_does_not_chain_is_rejected(stages, why):
    with pytest.raises(ValueError, match=why):
        port.Variant("bad", **stages)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["dense_bf16", "ragged_dot"])
def test_baselines_answer_the_dense_oracle(rng, name):
    inputs = moe.make_inputs(POINT, rng)
    got, result = check(POINT, moe.baseline(name, POINT), inputs)
    assert set(got) == {"out_dense"}
    assert result["passed"], result


# The interpreter runs the Hopper variants; the Blackwell ones only lower
# (tests/moe_nvfp4/test_moe_nvfp4_sm100.py).
RUNS = [(name, "check") for name, v in port.VARIANTS.items() if v.arch == "sm_90a"] + [
    ("moe_fused", "time")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "purpose"), RUNS, ids=[f"{n}-{p}" for n, p in RUNS])
def test_every_variant_runs_through_the_plugin_and_passes(rng, name, purpose):
    inputs = moe.make_inputs(POINT, rng)
    moe.reset()
    runnable = moe.kernel(name, POINT, purpose)
    assert runnable.execution["interpret"] and runnable.execution["poisoned"]
    assert runnable.execution["race_detection"] == (purpose == "check")
    got, result = check(POINT, runnable, inputs)
    assert tuple(got) == port.VARIANTS[name].outputs()
    assert result["passed"], result
    assert not moe.races_found()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(port.VARIANTS))
def test_every_variant_lowers_at_the_largest_upstream_shape(name):
    params = next(p["params"] for p in SPEC["build_only_points"] if p["name"] == "g6_m1024")
    for artifact in moe.build(name, params)["artifacts"]:
        facts = artifact["facts"]
        assert 0 < facts["dynamic_smem_bytes"] <= facts["smem_limit_bytes"], artifact


@pytest.mark.timeout(300)
def test_on_an_sm90_gpu_the_variants_run_for_real_not_interpreted(monkeypatch):
    import jax

    gpu = SimpleNamespace(platform="gpu", compute_capability="9.0", device_kind="NVIDIA H100")
    monkeypatch.setattr(jax, "devices", lambda *args: [gpu])
    runnable = moe.kernel(next(iter(port.VARIANTS)), POINT, "check")
    assert not runnable.execution["interpret"] and "H100 (sm_90a)" in runnable.execution["mode"]


def test_the_checks_fail_a_wrong_code_and_a_wrong_value(rng):
    inputs = moe.make_inputs(POINT, rng)
    want = moe.oracle(POINT, inputs)
    row = 0 if inputs["masked_m"][0] else 1  # an expert with rows
    codes = numerics.unpack(inputs["a1_packed"])
    codes[row, 0, 0] = (codes[row, 0, 0] + 3) % 8  # a code three steps away
    planes = np.stack([numerics.e2m1_value(codes), np.repeat(
        numerics.e4m3_value(inputs["a1_scales"]), numerics.BLOCK, axis=-1)])
    assert not moe.compare(POINT, {}, "a1", planes, want["a1"], tolerance("a1"))["passed"]
    planes[0] = numerics.e2m1_value(numerics.unpack(inputs["a1_packed"]))
    assert moe.compare(POINT, {}, "a1", planes, want["a1"], tolerance("a1"))["passed"]
    out = np.nan_to_num(want["out"][0]).copy()
    assert moe.compare(POINT, {}, "out", out, want["out"], tolerance("out"))["passed"]
    out[row, 0, 0] += 0.02 * np.abs(out[row]).max()
    assert not moe.compare(POINT, {}, "out", out, want["out"], tolerance("out"))["passed"]
    out[row, 0, 0] = np.nan
    assert not moe.compare(POINT, {}, "out", out, want["out"], tolerance("out"))["passed"]


@pytest.mark.timeout(120)
def test_build_lowers_every_kernel_of_a_variant_with_its_shared_memory():
    built = moe.build("moe_unfused", POINT)
    kinds = [a["kind"].split(": ")[1].split(" ")[0] for a in built["artifacts"]]
    assert kinds == ["quantize", "requantize", "gemm1", "gemm2"]
    for artifact in built["artifacts"]:
        facts = artifact["facts"]
        assert 0 < facts["dynamic_smem_bytes"] <= facts["smem_limit_bytes"]
        assert facts["block"] == [128, 1, 1]


def test_the_reference_source_is_found_from_the_reference_lock_without_importing_it():
    """env/reference.lock installs FlashInfer without torch: its kernel file is there to
    hash, and FlashInfer itself was never imported (it could not be)."""
    path = Path(moe.reference_file())
    assert path.name == "grouped_gemm_masked_blackwell.py"
    assert "class Sm100BlockScaledPersistentDenseGemmKernel" in path.read_text()
    assert "flashinfer" not in sys.modules
