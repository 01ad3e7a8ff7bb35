"""Case 02's Blackwell (sm_100a) forward, warp specialised: lowered on this host at every
point with its shared- and tensor-memory budgets, its warpgroups and the MMA it issues,
refused where it cannot run. No
interpreter runs it (tcgen05, tensor memory), so nothing here executes the kernel: what
it computes is for a Blackwell GPU."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import pytest

import kernels.splash_attention as case
from casebook.core import config
from kernels import contract, mgpu_lowering
from kernels.splash_attention import (
    builds,
    mgpu_backward_sm100,
    mgpu_forward,
    mgpu_forward_sm100,
    port,
)

pytestmark = pytest.mark.host_rehearsal

SPEC = config.load_case(config.load_global()["case_dir"], "splash_attention")
POINTS = [p for key in ("points", "build_only_points") for p in SPEC[key]]
F16_MMA = "tcgen05.mma.cta_group::1.kind::f16"


def test_the_case_ships_blackwell_variants():
    assert set(port.BLACKWELL_FORWARD) == {"mgpu_sm100a", "mgpu_sm100a_mask_tiles"}
    assert set(port.BLACKWELL_BACKWARD) == {"mgpu_sm100a_bwd"}
    assert set(port.BLACKWELL_VARIANTS) <= {v["name"] for v in SPEC["variants"]}
    assert {port.arch(v) for v in port.BLACKWELL_VARIANTS} == {"sm_100a"}
    assert case.outputs("mgpu_sm100a_bwd") == ("dq", "dk", "dv")
    assert {port.arch(v) for v in (*port.FORWARD_VARIANTS, *port.BACKWARD_VARIANTS)} == {
        "sm_90a"}


@pytest.mark.compile
@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", port.BLACKWELL_FORWARD)
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
    # S and O accumulators per q tile, rounded up to a power of two by the allocator.
    asked_columns = mgpu_forward_sm100.tmem_columns(problem, tiles)
    assert asked_columns <= facts["tmem_columns"] <= mgpu_lowering.TMEM_COLUMNS
    assert facts["tmem_columns"] < 2 * asked_columns
    has_tiles = variant == "mgpu_sm100a_mask_tiles"
    asked = mgpu_forward_sm100.smem_bytes(problem, tiles, has_tiles)
    assert asked <= facts["dynamic_smem_bytes"] <= mgpu_forward.SMEM_LIMIT_BYTES
    # Two q tiles in flight wherever S and O of both fit tensor memory (Dv <= 128).
    assert tiles.q_tiles == (2 if params["head_dim"] <= 128 else 1)
    assert facts["tuning"]["q_tiles_in_flight"] == tiles.q_tiles
    assert sorted(facts["grid"]) == sorted([params["seq_len"] // tiles.block_q,
                                            params["heads_q"], 1])
    # A softmax warpgroup per q tile (a row of tensor memory per thread), and the
    # producer warpgroup (a TMA warp, an MMA warp).
    assert facts["block"] == [128 * (tiles.q_tiles + 1), 1, 1]
    assert facts["mask_source"] == ("MaskInfo partial tiles (TMA)" if has_tiles
                                    else "upstream mask function on iota")
    if params["seq_len"] > tiles.block_q:  # one q block sees every kv block
        assert built["block_census"]["empty"] > 0  # causal and local masks skip blocks


def test_the_tiles_take_two_q_tiles_then_the_widest_block_kv_and_deepest_ring_that_fit():
    params = {"heads_q": 16, "heads_kv": 16, "seq_len": 4096, "mask": {"kind": "causal"},
              "dtype": "bfloat16"}
    chosen = {d: port.blackwell_tuning({**params, "head_dim": d}) for d in (64, 128, 256)}
    assert chosen == {64: mgpu_forward_sm100.TuningConfig(64, 2, 2),
                      128: mgpu_forward_sm100.TuningConfig(64, 2, 2),
                      256: mgpu_forward_sm100.TuningConfig(64, 1, 1)}
    for d, tiles in chosen.items():
        problem = port.problem({**params, "head_dim": d})
        assert (mgpu_forward_sm100.smem_bytes(problem, tiles, has_tiles=True)
                <= mgpu_forward.SMEM_LIMIT_BYTES)
        assert mgpu_forward_sm100.tmem_columns(problem, tiles) <= mgpu_lowering.TMEM_COLUMNS


def test_a_configuration_over_a_memory_budget_is_refused_naming_it():
    problem = mgpu_forward.Problem(1, 1, 1024, 1024, 256, 256, "float16")
    with pytest.raises(ValueError, match=r"TuningConfig\(block_kv=128, stages=2, q_tiles=1\): "
                                         r"360520 bytes of shared memory exceed the "
                                         r"232448-byte limit"):
        mgpu_forward_sm100.check(problem, mgpu_forward_sm100.TuningConfig(128, 2, 1),
                                 has_tiles=False)
    # Two q tiles of head dim 256: S and O of both need 640 columns.
    with pytest.raises(ValueError, match=r"TuningConfig\(block_kv=64, stages=1, q_tiles=2\): "
                                         r"640 tensor-memory columns exceed the 512"):
        mgpu_forward_sm100.check(problem, mgpu_forward_sm100.TuningConfig(64, 1, 2),
                                 has_tiles=False)
    # Narrower tiles in a one-slot ring, one q tile, fit, with the partial-tile ring too.
    mgpu_forward_sm100.check(problem, mgpu_forward_sm100.TuningConfig(64, 1, 1),
                             has_tiles=True)


def test_what_the_kernel_cannot_do_is_refused_by_name():
    with pytest.raises(ValueError, match="block_kv"):
        mgpu_forward_sm100.TuningConfig(block_kv=96)
    with pytest.raises(ValueError, match="stages"):
        mgpu_forward_sm100.TuningConfig(stages=5)
    with pytest.raises(ValueError, match="q_tiles"):
        mgpu_forward_sm100.TuningConfig(q_tiles=3)
    tiles = mgpu_forward_sm100.TuningConfig(64, 2, 2)
    with pytest.raises(ValueError, match=r"multiples of \(config.block_q=256"):
        mgpu_forward_sm100.check(mgpu_forward.Problem(1, 1, 384, 384, 64, 64, "float16"),
                                 tiles, has_tiles=False)
    with pytest.raises(ValueError, match="no interpreter runs an sm_100a kernel"):
        port.make("mgpu_sm100a", POINTS[0]["params"], interpret=object())


@pytest.mark.compile
def test_the_forward_returns_logsumexp_for_a_backward():
    """out and logsumexp [Hq, Sq] f32, as the Hopper forward gives the backward."""
    params = POINTS[0]["params"]
    tiles = port.blackwell_tuning(params)
    forward = mgpu_forward_sm100.make(port.problem(params, return_lse=True), tiles,
                                      port.plan("mgpu_sm100a", params))
    q, k, v = builds.arg_shapes(params)
    out, lse = jax.eval_shape(lambda q, k, v: forward(q, jnp.swapaxes(k, 1, 2), v), q, k, v)
    assert out.shape == q.shape and lse.shape == q.shape[:2] and lse.dtype == jnp.float32
    (launch,) = mgpu_lowering.lower_for_cuda(
        lambda q, k, v: forward(q, jnp.swapaxes(k, 1, 2), v), (q, k, v))["launches"]
    assert launch["tcgen05_mma"] == [F16_MMA]


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


@pytest.mark.compile
@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", POINTS, ids=[p["name"] for p in POINTS])
def test_the_blackwell_backward_lowers_at_every_point_within_its_budgets(point):
    """dQ, then dK and dV in one launch, or in two where both do not fit tensor memory
    beside Sᵀ and dPᵀ (head dim 256): each on the f16 MMA, within both budgets."""
    params = point["params"]
    built = case.build("mgpu_sm100a_bwd", params)
    config_ = port.blackwell_backward_tuning(params)
    problem = port.problem(params)
    budgets = mgpu_backward_sm100.budgets(problem, config_, has_tiles=False)
    names = [a["facts"]["kernel"] for a in built["artifacts"]]
    assert names == (["dq", "dk+dv"] if params["head_dim"] <= 128 else ["dq", "dv", "dk"])
    assert names == list(budgets)
    for artifact in built["artifacts"]:
        facts = artifact["facts"]
        smem, columns = budgets[facts["kernel"]]
        assert artifact["target"] == "cuda sm_100a"
        assert facts["tcgen05_mma"] == [F16_MMA]
        assert columns <= facts["tmem_columns"] < 2 * columns
        assert facts["tmem_columns"] <= mgpu_lowering.TMEM_COLUMNS
        assert smem <= facts["dynamic_smem_bytes"] <= mgpu_forward.SMEM_LIMIT_BYTES
        assert facts["block"] == [128, 1, 1]
        rows = params["heads_q"] if facts["kernel"] == "dq" else params["heads_kv"]
        assert sorted(facts["grid"]) == sorted([rows, params["seq_len"] // 128, 1])


def test_the_blackwell_backward_refuses_what_does_not_fit_naming_it():
    problem = mgpu_forward.Problem(1, 1, 1024, 1024, 256, 256, "float16")
    config_ = mgpu_backward_sm100.BackwardConfig(64, 2)
    with pytest.raises(ValueError, match=r"BackwardConfig\(block=64, stages=2\) \(dq kernel\)"
                                         r": 279584 bytes of shared memory exceed"):
        mgpu_backward_sm100.check(problem, config_, has_tiles=False)
    one_slot = mgpu_backward_sm100.BackwardConfig(64, 1)
    assert mgpu_backward_sm100.dkv_parts(problem, one_slot) == (("dv",), ("dk",))
    mgpu_backward_sm100.check(problem, one_slot, has_tiles=False)
    with pytest.raises(ValueError, match=r"parts=.*one or both"):
        mgpu_backward_sm100.make_dkv(problem, one_slot, None, ("dv", "dk"))
    with pytest.raises(ValueError, match=r"multiples of 128"):
        mgpu_backward_sm100.check(mgpu_forward.Problem(1, 1, 192, 192, 64, 64, "float16"),
                                  one_slot, has_tiles=False)
    with pytest.raises(ValueError, match="block=32"):
        mgpu_backward_sm100.BackwardConfig(32, 1)
    with pytest.raises(ValueError, match="no interpreter runs an sm_100a kernel"):
        port.make_backward("mgpu_sm100a_bwd", POINTS[0]["params"], interpret=object())
