"""Case 02's Blackwell (sm_100a) forward: lowered on this host at every point with its
shared- and tensor-memory budgets and the MMA it issues, refused where it cannot run. No
interpreter runs it (tcgen05, tensor memory), so nothing here executes the kernel: what
it computes is for a Blackwell GPU."""

from __future__ import annotations

import types

import jax
import pytest

import kernels.splash_attention as case
from casebook import config
from kernels import contract, mgpu_lowering
from kernels.splash_attention import mgpu_forward, mgpu_forward_sm100, port

SPEC = config.load_case(config.load_global()["case_dir"], "splash_attention")
POINTS = [p for key in ("points", "build_only_points") for p in SPEC[key]]
F16_MMA = "tcgen05.mma.cta_group::1.kind::f16"


def test_the_case_ships_blackwell_variants():
    assert set(port.BLACKWELL_VARIANTS) == {"mgpu_sm100a", "mgpu_sm100a_mask_tiles"}
    assert set(port.BLACKWELL_VARIANTS) <= {v["name"] for v in SPEC["variants"]}
    assert {port.arch(v) for v in port.BLACKWELL_VARIANTS} == {"sm_100a"}
    assert {port.arch(v) for v in (*port.FORWARD_VARIANTS, *port.BACKWARD_VARIANTS)} == {
        "sm_90a"}


@pytest.mark.compile
@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", port.BLACKWELL_VARIANTS)
@pytest.mark.parametrize("point", POINTS, ids=[p["name"] for p in POINTS])
def test_every_point_lowers_for_sm100a_within_its_budgets(variant, point):
    params = point["params"]
    built = case.build(variant, params)
    (artifact,) = built["artifacts"]
    facts = artifact["facts"]
    tiles = port.blackwell_tuning(params)
    problem = port.problem(params)
    assert artifact["target"] == "cuda sm_100a"
    assert facts["tcgen05_mma"] == [F16_MMA]
    # S and P·V accumulators, rounded up to a power of two by the allocator, within 512.
    asked_columns = mgpu_forward_sm100.tmem_columns(problem, tiles)
    assert asked_columns <= facts["tmem_columns"] <= mgpu_lowering.TMEM_COLUMNS
    assert facts["tmem_columns"] < 2 * asked_columns
    has_tiles = variant == "mgpu_sm100a_mask_tiles"
    asked = mgpu_forward_sm100.smem_bytes(problem, tiles, has_tiles)
    assert asked <= facts["dynamic_smem_bytes"] <= mgpu_forward.SMEM_LIMIT_BYTES
    assert sorted(facts["grid"]) == sorted([params["seq_len"] // 128, params["heads_q"], 1])
    assert facts["block"] == [128, 1, 1]  # one warpgroup: a row of tensor memory per thread
    assert facts["mask_source"] == ("MaskInfo partial tiles (TMA)" if has_tiles
                                    else "upstream mask function on iota")
    assert built["block_census"]["empty"] > 0  # causal and local masks skip blocks


def test_the_tiles_take_the_widest_block_kv_and_deepest_ring_that_fit():
    params = {"heads_q": 16, "heads_kv": 16, "seq_len": 4096, "mask": {"kind": "causal"},
              "dtype": "bfloat16"}
    chosen = {d: port.blackwell_tuning({**params, "head_dim": d}) for d in (64, 128, 256)}
    assert chosen == {64: mgpu_forward_sm100.TuningConfig(128, 2),
                      128: mgpu_forward_sm100.TuningConfig(64, 2),
                      256: mgpu_forward_sm100.TuningConfig(64, 1)}
    for d, tiles in chosen.items():
        problem = port.problem({**params, "head_dim": d})
        assert (mgpu_forward_sm100.smem_bytes(problem, tiles, has_tiles=True)
                <= mgpu_forward.SMEM_LIMIT_BYTES)


def test_a_configuration_over_the_shared_memory_budget_is_refused_naming_it():
    problem = mgpu_forward.Problem(1, 1, 1024, 1024, 256, 256, "float16")
    tiles = mgpu_forward_sm100.TuningConfig(128, 2)
    with pytest.raises(ValueError, match=r"TuningConfig\(block_kv=128, stages=2\): 360480 "
                                         r"bytes of shared memory exceed the 232448-byte limit"):
        mgpu_forward_sm100.check(problem, tiles, has_tiles=False)
    # Narrower tiles in a one-slot ring fit, with the partial-tile ring too.
    fits = mgpu_forward_sm100.TuningConfig(64, 1)
    mgpu_forward_sm100.check(problem, fits, has_tiles=True)


def test_what_the_kernel_cannot_do_is_refused_by_name():
    with pytest.raises(ValueError, match="block_kv"):
        mgpu_forward_sm100.TuningConfig(block_kv=96)
    with pytest.raises(ValueError, match="stages"):
        mgpu_forward_sm100.TuningConfig(stages=5)
    tiles = mgpu_forward_sm100.TuningConfig()
    with pytest.raises(ValueError, match=r"multiples of \(128"):
        mgpu_forward_sm100.check(mgpu_forward.Problem(1, 1, 192, 192, 64, 64, "float16"),
                                 tiles, has_tiles=False)
    with pytest.raises(ValueError, match="no logsumexp"):
        mgpu_forward_sm100.check(mgpu_forward.Problem(1, 1, 256, 256, 64, 64, "float16",
                                                      return_lse=True), tiles, has_tiles=False)
    with pytest.raises(ValueError, match="no interpreter runs an sm_100a kernel"):
        port.make("mgpu_sm100a", POINTS[0]["params"], interpret=object())


def test_no_host_without_a_blackwell_gpu_runs_them(monkeypatch):
    params = POINTS[0]["params"]
    for variant in port.BLACKWELL_VARIANTS:
        with pytest.raises(contract.NotRunnable, match="lowered only, never run"):
            case.kernel(variant, params, "check")
    hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0",
                                   device_kind="NVIDIA H200")
    monkeypatch.setattr(jax, "devices", lambda: [hopper])
    with pytest.raises(contract.NotRunnable, match=r"Blackwell \(sm_100a\).*H200.*9\.0"):
        case.kernel("mgpu_sm100a", params, "time")
