"""Case 01's tuning loop: the Hopper GEMM's tile candidates, the tuned row applied to the
kernel, and the loop's record of whether its pick is the variant's hand choice.

Nothing here measures a GPU: the end-to-end test runs the real measurement engine on
the Mosaic GPU interpreter (a mechanics test; its record says interpret mode).
"""

from __future__ import annotations

import pytest

import kernels.moe_nvfp4 as case
from casebook.core import cases, config, records
from casebook.report import page_tables
from casebook.stages import autotune
from kernels.moe_nvfp4 import autotune as candidates_of
from kernels.moe_nvfp4 import mgpu_gemm, port
from kernels.moe_nvfp4.mgpu_mainloop import SMEM_LIMIT_BYTES
from tests.projects import MEASUREMENT

SPEC = config.load_case("configs/cases", "moe_nvfp4")
SMALL = SPEC["points"][0]["params"]  # experts 2, m 128, hidden 256, inter 256
UPSTREAM = SPEC["build_only_points"][0]["params"]  # the benchmark's GEMM1: (4096, 7168)


def test_the_case_tunes_two_hopper_gemms_by_hand_choice():
    assert SPEC["autotune"]["variants"] == ["gemm1_m128n128s3", "gemm2_m128n128s3"]
    for variant in SPEC["autotune"]["variants"]:
        found = candidates_of.tile_candidates(variant, SMALL)
        assert found["key"] == "tiles"
        assert found["hand"] == {"block_m": 128, "block_n": 128, "stages": 3,
                                 "persistent_ctas": 0}
        assert found["hand"] in [c["tiles"] for c in found["kept"]]


@pytest.mark.parametrize("params", [SMALL, UPSTREAM], ids=["small", "upstream"])
def test_candidates_fit_the_budget_and_divide_the_gemm_and_rejects_say_why(params):
    found = candidates_of.tile_candidates("gemm1_m128n128s3", params)
    n, m = 2 * params["inter"], params["m"]
    assert len(found["kept"]) + len(found["rejected"]) == 2 * 3 * 3 * 2
    for kept in found["kept"]:
        tiles = kept["tiles"]
        config_ = mgpu_gemm.TuningConfig(**tiles)
        assert kept["smem_bytes"] == {"gemm1": mgpu_gemm.smem_bytes(config_)}
        assert kept["smem_bytes"]["gemm1"] <= SMEM_LIMIT_BYTES
        assert m % tiles["block_m"] == 0 and n % tiles["block_n"] == 0
        assert kept["tie_order"] == [tiles["stages"], int(tiles["persistent_ctas"] > 0),
                                     tiles["block_m"] * tiles["block_n"]]
    for rejected in found["rejected"]:
        assert "over the 232,448-byte limit" in rejected["reason"] or "multiples" in \
            rejected["reason"]
        if rejected["smem_bytes"]:
            assert rejected["smem_bytes"]["gemm1"] > SMEM_LIMIT_BYTES


def test_only_a_variant_running_one_hopper_gemm_has_a_tile_choice():
    for name in ("moe_fused", "fused", "quantize", "gemm1_sm100a_n128k256s3"):
        with pytest.raises(ValueError, match=r"has no tile choice; tunable: .*gemm1_m64n64s2"):
            candidates_of.tile_candidates(name, SMALL)
        # A point's tile row is for the single-GEMM variants: the others keep their own.
        tiles = {"block_m": 64, "block_n": 64, "stages": 2, "persistent_ctas": 0}
        assert port.with_tiles(port.VARIANTS[name], tiles) is port.VARIANTS[name]
    assert port.with_tiles(port.VARIANTS["gemm2_m128n128s3"], tiles).gemm2 == \
        mgpu_gemm.TuningConfig(**tiles)


@pytest.mark.compile
def test_a_tile_row_in_the_params_is_the_kernel_that_is_built():
    tiles = {"block_m": 64, "block_n": 64, "stages": 4, "persistent_ctas": 0}
    (hand,) = case.build("gemm2_m128n128s3", SMALL)["artifacts"]
    (tuned,) = case.build("gemm2_m128n128s3", {**SMALL, "tiles": tiles})["artifacts"]
    e, m, k = SMALL["experts"], SMALL["m"], SMALL["hidden"]
    assert sorted(hand["facts"]["grid"]) == sorted([e, k // 128, m // 128])
    assert sorted(tuned["facts"]["grid"]) == sorted([e, k // 64, m // 64])
    assert "stages=4" in tuned["facts"]["config"]
    # The candidates' budget is the lowering's own count (buffers + reduction scratch).
    assert tuned["facts"]["dynamic_smem_bytes"] == mgpu_gemm.smem_bytes(
        mgpu_gemm.TuningConfig(**tiles))


@pytest.mark.compile
def test_every_kept_candidate_lowers_and_every_budget_reject_is_refused_by_the_lowering():
    """The filter is the lowering's own verdict: at the smallest point, each kept
    candidate's kernel lowers within the limit, and each candidate rejected for shared
    memory fails its lowering (or the kernel's own budget check) naming the limit."""
    found = candidates_of.tile_candidates("gemm1_m128n128s3", SMALL)
    for kept in found["kept"][:6]:
        (artifact,) = case.build("gemm1_m128n128s3", {**SMALL, "tiles": kept["tiles"]})[
            "artifacts"]
        assert artifact["facts"]["dynamic_smem_bytes"] == kept["smem_bytes"]["gemm1"]
    for rejected in [r for r in found["rejected"] if r["smem_bytes"]][:3]:
        with pytest.raises(ValueError, match=r"shared memory|232448"):
            case.build("gemm1_m128n128s3", {**SMALL, "tiles": rejected["tiles"]})


@pytest.mark.interpret
@pytest.mark.timeout(600)
def test_the_loop_records_whether_it_picked_the_hand_choice(tmp_path):
    """Mechanics on the CPU: two candidates of the smallest point (the hand choice and one
    other), each verified against the float64 oracle in the Mosaic GPU interpreter and
    timed by the real engine there; then the same loop without the hand choice among the
    candidates records that it picked other tiles."""
    space = {"block_m": (128,), "block_n": (64, 128), "stages": (3,), "persistent_ctas": (0,)}
    found = candidates_of.tile_candidates("gemm1_m128n128s3", SMALL, space)
    assert len(found["kept"]) == 2 and found["hand"] in [c["tiles"] for c in found["kept"]]
    plugin, path = cases.load("moe_nvfp4"), config.case_path("configs/cases", "moe_nvfp4")
    out = str(tmp_path / "tiles/gemm1/e2.json")
    autotune.choose(plugin, SPEC, path, "gemm1_m128n128s3", SPEC["points"][0]["name"], "cpu",
                    MEASUREMENT, found, out, str(tmp_path / "samples"))
    record = records.read(out, "tile_choice")  # read back through the schema
    assert record["hand"] == found["hand"]
    assert record["pick_is_hand"] == (record["pick"]["tiles"] == found["hand"])
    for candidate in record["candidates"]:
        assert candidate["execution"]["interpret"] is True
        assert candidate["verify"]["passed"] and candidate["timed"]
    page = page_tables.tile_choices(
        type("Ev", (), {"target": "cpu", "case": "moe_nvfp4", "tile_choices": {
            ("gemm1_m128n128s3", "e2"): record}}), href=lambda path: None)
    assert page.count("yes: the loop ") == 1

    without_hand = {**found, "kept": [c for c in found["kept"] if c["tiles"] != found["hand"]]}
    out = str(tmp_path / "tiles/gemm1/e2_without_hand.json")
    autotune.choose(plugin, SPEC, path, "gemm1_m128n128s3", SPEC["points"][0]["name"], "cpu",
                    MEASUREMENT, without_hand, out, str(tmp_path / "samples2"))
    assert records.read(out, "tile_choice")["pick_is_hand"] is False
