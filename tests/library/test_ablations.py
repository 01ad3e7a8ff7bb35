"""Ablations: a verified variant with one part switched off, declared in the case config,
built by the case's plug-in, each against a model of what it computes (not the oracle:
it computes a wrong result on purpose), and drawn on a "where the time goes" figure."""

from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

import kernels.splash_attention as splash
from casebook.core import config
from casebook.core.errors import CasebookError
from casebook.report import figures
from casebook.stages import verify
from kernels.moe_nvfp4 import ablations as moe_ablations
from kernels.moe_nvfp4 import mgpu_quantize, numerics, port
from kernels.splash_attention import ablations, masks, oracle_f64
from tests.projects import cases_with

SPLASH = config.load_case("configs/cases", "splash_attention")
POINT = {**SPLASH["points"][0]["params"], "heads_q": 1, "heads_kv": 1}  # two warpgroups


@pytest.mark.parametrize(("case", "entry", "key", "why"), [
    ("moe_nvfp4", {"name": "moe_fused", "of": "moe_fused"}, "ablations.0.name",
     "'moe_fused' is a variant"),
    ("moe_nvfp4", {"name": "moe_fused_no_fusion", "of": "moe_fusd"}, "ablations.0.of",
     "no variant named 'moe_fusd'"),
    ("moe_nvfp4", {"name": "moe_fused_no_fusio", "of": "moe_fused"}, "ablations.0.name",
     "unknown moe_nvfp4 ablation 'moe_fused_no_fusio'"),
    ("moe_nvfp4", {"name": "moe_fused_no_fusion", "of": "gemm1_persistent"}, "ablations.0.of",
     "is 'gemm1_persistent', but the case's plug-in ablates 'moe_fused'"),
    ("grouped_gemm_fp8_bf16", {"name": "no_scales", "of": "cute_dsl"}, "ablations.0.name",
     "has no ablations")])
def test_a_config_ablation_is_one_the_plugin_has_of_the_variant_it_says(
        tmp_path, case, entry, key, why):
    spec = config.load_case("configs/cases", case)
    if case == "grouped_gemm_fp8_bf16":
        entry = {**entry, "of": spec["variants"][0]["name"]}
    cases = cases_with(tmp_path, case, "ablations", [{"switches_off": "a part", "description": "d",
                                         **entry}])
    with pytest.raises(CasebookError, match=f"{key}: .*{why}"):
        config.load_case(cases, case)


def _forward(name: str, inputs: dict) -> np.ndarray:
    runnable = splash.kernel(name, POINT, "check")
    return np.asarray(runnable.fetch(runnable.call(*runnable.prepare(inputs))), np.float64)


# Against a model of what an ablation computes (a blocky mask, a softmax never rescaled),
# which the case's bound does not describe: upstream's fixed forward tolerance at f16.
MODEL_TOLERANCE = 3e-3


def _near_model(got, model) -> bool:
    return verify.compare(got, model, MODEL_TOLERANCE, MODEL_TOLERANCE)["passed"]


def _within_bound(got, inputs, want) -> bool:
    """The case's own check of ``out``: each element within its bound (``bounds``)."""
    atol, rtol = config.shipped_tolerance("splash_attention", POINT["dtype"], "out")
    return splash.compare(POINT, inputs, "out", got, want,
                          {"atol": atol, "rtol": rtol})["passed"]


def _block_visible(params: dict, block_q: int, block_kv: int) -> np.ndarray:
    """The mask with every partially visible block made wholly visible."""
    dense = masks.dense_mask(params)  # [S, S]: one mask for every head
    s = dense.shape[-1]
    blocks = dense.reshape(s // block_q, block_q, s // block_kv, block_kv).any(axis=(1, 3))
    return np.repeat(np.repeat(blocks, block_q, axis=0), block_kv, axis=1)


def _unrescaled(q, k, v, mask, block_kv: int) -> np.ndarray:
    """Online softmax that never rescales: O and l summed with each block's own max."""
    s = np.einsum("hqd,hkd->hqk", q, k)
    s = np.where(mask, s, -np.inf)
    out = np.zeros((*q.shape[:2], v.shape[2]))
    total = np.zeros(q.shape[:2])
    running = np.full(q.shape[:2], -np.inf)
    for start in range(0, s.shape[2], block_kv):
        block = s[:, :, start:start + block_kv]
        if not np.isfinite(block).any():
            continue  # an empty block is never visited
        running = np.maximum(running, block.max(axis=2))
        with np.errstate(invalid="ignore"):
            p = np.exp(block - running[..., None])
        p = np.where(np.isfinite(block), p, 0.0)
        total += p.sum(axis=2)
        out += np.einsum("hqk,hkd->hqd", p, v[:, start:start + block_kv])
    return out / np.where(total > 0, total, 1.0)[..., None]


@pytest.mark.timeout(240)  # a barrier bug hangs the interpreter
def test_each_splash_ablation_computes_what_its_switch_says():
    inputs = splash.make_inputs(POINT, np.random.default_rng())
    q, k, v = (inputs[n].astype(np.float64) for n in ("q", "k", "v"))
    want = splash.oracle(POINT, inputs)["out"]
    tiles = POINT["tiles"]
    # Mask evaluation off: the mask at block granularity, wrong against the oracle.
    got = _forward("mgpu_no_mask_evaluation", inputs)
    blocky = oracle_f64.attention(q, k, v, _block_visible(POINT, tiles["block_q"],
                                                          tiles["block_kv"]))
    assert _near_model(got, blocky) and not _within_bound(got, inputs, want)
    # Rescaling off: each block's exponentials against the running max when it was seen.
    got = _forward("mgpu_no_rescaling", inputs)
    unrescaled = _unrescaled(q, k, v, masks.dense_mask(POINT), tiles["block_kv"])
    assert _near_model(got, unrescaled) and not _within_bound(got, inputs, want)
    # One compute warpgroup, one stage: the same result another way.
    for name in ("mgpu_one_compute_wg", "mgpu_one_stage"):
        assert _within_bound(_forward(name, inputs), inputs, want), name
    assert not splash.races_found()
    splash.reset()


def test_an_ablation_whose_part_the_kernel_lacks_does_not_apply():
    one_wg = {**POINT, "tiles": {**POINT["tiles"], "compute_wgs": 1, "block_q": 64}}
    assert "one compute warpgroup" in splash.ablation_refusal("mgpu_one_compute_wg", one_wg)
    assert splash.ablation_refusal("mgpu_one_compute_wg", POINT) is None
    one_stage = {**POINT, "tiles": {**POINT["tiles"], "stages": 1}}
    assert "one stage" in splash.ablation_refusal("mgpu_one_stage", one_stage)
    with pytest.raises(ValueError, match="does not apply"):
        ablations.configured("mgpu_one_stage", splash.port.tuning(one_stage))
    persistent = port.VARIANTS["gemm1_persistent"]
    assert moe_ablations.find("gemm1_no_persistent").refuse(persistent) is None
    assert moe_ablations.configured("gemm1_no_persistent",
                                    persistent).gemm1.persistent_ctas == 0
    with pytest.raises(ValueError, match="unknown splash_attention ablation"):
        splash.ablates("mgpu_no_softmax")


@pytest.mark.timeout(240)  # a barrier bug hangs the interpreter
def test_an_ablation_lowers_with_its_own_resources():
    built = splash.build("mgpu_one_compute_wg", POINT)["artifacts"][0]["facts"]
    kernel = splash.build("mgpu", POINT)["artifacts"][0]["facts"]
    assert kernel["block"][0] == 384 and built["block"][0] == 128  # 3 warpgroups -> 1
    assert built["tuning"]["compute_warpgroups"] == 1
    stage = splash.build("mgpu_one_stage", POINT)["artifacts"][0]["facts"]
    assert stage["tuning"]["stages"] == 1
    assert stage["dynamic_smem_bytes"] < kernel["dynamic_smem_bytes"]


@pytest.mark.timeout(240)  # a barrier bug hangs the interpreter
def test_given_scales_quantize_every_block_at_scale_one():
    e, m, k = 2, 64, 256
    rng = np.random.default_rng()
    x = (rng.standard_normal((e, m, k)) * 2).astype(jnp.bfloat16)
    gs = np.array([0.5, 2.0], np.float32)  # powers of two: x * gs is exact
    masked = np.array([64, 40], np.int32)
    config_ = mgpu_quantize.QuantizeConfig(64, produce_scales=False)
    from kernels import mgpu_interpret

    interpret, _ = mgpu_interpret.placement("check")
    packed, scales = mgpu_quantize.make(e, m, k, config_, interpret)(
        jnp.asarray(x), jnp.asarray(gs), jnp.asarray(masked))
    packed, scales = np.asarray(packed), np.asarray(scales)
    want = numerics.codes_for_scales(np.asarray(x, np.float64), gs.astype(np.float64),
                                     np.ones((e, m, k // 16)))
    for expert, rows in enumerate(masked):
        assert (scales[expert, :rows] == mgpu_quantize.GIVEN_SCALE[1]).all()
        assert (numerics.unpack(packed[expert, :rows]) == want[expert, :rows]).all()
    produced = numerics.quantize(np.asarray(x, np.float64), gs.astype(np.float64))[1]
    assert (produced[:, :40] != mgpu_quantize.GIVEN_SCALE[1]).any()  # a real change


def _timed(median: float, **more) -> dict:
    return {"timed": True, "execution": {"interpret": True, "mode": "interpret"},
            "measurement": {"median_s": median, "ci_low_s": median * 0.9,
                            "ci_high_s": median * 1.1}, **more}


def _artifact(smem: int, block: int) -> dict:
    return {"facts": {"dynamic_smem_bytes": smem, "block": [block, 1, 1], "grid": [2, 2, 1]}}


def test_the_figure_puts_each_ablation_beside_its_kernel(tmp_path):
    def ablated(name, median, within, worst):
        return _timed(median, ablation=name, applies=True,
                      built={"ok": True, "artifacts": [_artifact(1000, 128)]},
                      against_oracle={"within_tolerance": within,
                                      "worst_error_over_tolerance": worst, "nan_count": 0})
    ev = SimpleNamespace(
        target="cpu", host={"gpus": []}, subjects=lambda made: [], spec=SPLASH,
        points=["p1", "p2"], time={("mgpu", "p1"): _timed(2.0), ("mgpu", "p2"): _timed(1.0)},
        builds={"mgpu": {"points": [{"point": "p1", "artifacts": [_artifact(2000, 384)]}]}},
        ablations={("mgpu_no_mask_evaluation", "p1"): ablated("mgpu_no_mask_evaluation",
                                                              1.0, False, 12.5),
                   ("mgpu_one_stage", "p1"): ablated("mgpu_one_stage", 3.0, True, 0.1),
                   ("mgpu_one_compute_wg", "p1"): {
                       "ablation": "mgpu_one_compute_wg", "applies": False,
                       "not_applied_reason": "one already"}})
    plans, withheld = figures._ablation_plans(ev)
    assert [name for name, _ in plans] == ["ablation_mgpu"] and withheld == []
    meta = plans[0][1](str(tmp_path / "a.svg"))
    caption = meta["caption"]
    assert "p1: mgpu: 2,000 B smem, block 384, grid 2x2x1;" in caption
    assert ("mgpu_no_mask_evaluation: 0.5× the kernel's median; 1,000 B smem, block 128, "
            "grid 2x2x1; computes a wrong result (12.5× the tolerance)") in caption
    assert "mgpu_one_stage: 1.5× the kernel's median" in caption
    assert "the oracle's result within tolerance" in caption
    assert "mgpu_one_compute_wg: does not apply (one already)" in caption
    assert "p2:" not in caption  # no ablation timed there
    assert "not GPU time" in (tmp_path / "a.svg").read_text()
    ev.ablations = {}
    assert figures._ablation_plans(ev) == ([], [{
        "figure": "ablation_mgpu",
        "reason": "mgpu and an ablation of it were not both timed at any point on this target"}])
