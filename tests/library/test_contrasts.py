"""A case config's contrasts: two variants computing one result two ways (case 01: the
whole path fused against unfused), drawn on one figure with their launches and the
intermediate tensors each moves through memory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from casebook.core import config
from casebook.core.errors import CasebookError
from casebook.report import figures
from kernels.moe_nvfp4 import port
from tests.projects import cases_with

SPEC = config.load_case("configs/cases", "moe_nvfp4")


@pytest.mark.parametrize(("contrast", "key", "why"), [
    ({"variant": "moe_fusd", "against": "moe_unfused"}, "contrasts.0.variant",
     "no variant named 'moe_fusd'"),
    ({"variant": "moe_fused", "against": "moe_fused"}, "contrasts.0.against",
     "a variant against itself")])
def test_a_contrast_names_two_distinct_variants_of_the_case(tmp_path, contrast, key, why):
    cases = cases_with(tmp_path, "moe_nvfp4", "contrasts",
                       [{"name": "fusion", "title": "t", **contrast}])
    with pytest.raises(CasebookError, match=f"{key}: {why}"):
        config.load_case(cases, "moe_nvfp4")


def test_the_unfused_path_moves_h_and_act_through_memory_and_the_fused_does_not():
    e, m, k, n = 2, 128, 256, 512
    fused = port.intermediates(port.VARIANTS["moe_fused"], e, m, k, n)
    unfused = port.intermediates(port.VARIANTS["moe_unfused"], e, m, k, n)
    nvfp4 = {"a1": e * m * k // 2 + e * m * k // 16, "a2": e * m * n // 2 + e * m * n // 16}
    assert [(t["tensor"][:2], t["bytes"]) for t in fused] == [("a1", nvfp4["a1"]),
                                                              ("a2", nvfp4["a2"])]
    assert [(t["tensor"].split(":")[0], t["bytes"]) for t in unfused] == [
        ("a1", nvfp4["a1"]), ("h", e * m * 2 * n * 2), ("act", e * m * n * 2),
        ("a2", nvfp4["a2"])]
    assert port.intermediates(port.VARIANTS["gemm1_m128n128s3"], e, m, k, n) == []
    assert SPEC["contrasts"] == [{"name": "fusion", "title": SPEC["contrasts"][0]["title"],
                                  "variant": "moe_fused", "against": "moe_unfused"}]


def _timed(median: float) -> dict:
    return {"timed": True, "execution": {"interpret": True, "mode": "interpret"},
            "measurement": {"median_s": median, "ci_low_s": median * 0.9,
                            "ci_high_s": median * 1.1}}


def _evidence(times: dict) -> SimpleNamespace:
    builds = {v: {"points": [{"point": "p1", "artifacts": [{}] * launches}]}
              for v, launches in (("moe_fused", 3), ("moe_unfused", 4))}
    return SimpleNamespace(target="cpu", host={"gpus": []}, subjects=lambda made: [],
                           points=["p1", "p2"], time=times, builds=builds)


def test_the_figure_states_times_launches_and_traffic_where_both_were_timed(tmp_path):
    ev = _evidence({("moe_fused", "p1"): _timed(2.0), ("moe_unfused", "p1"): _timed(3.0),
                    ("moe_fused", "p2"): _timed(1.0)})
    contrast = SPEC["contrasts"][0]
    moved = {"moe_fused": {"p1": [{"tensor": "a2", "bytes": 10}]},
             "moe_unfused": {"p1": [{"tensor": "a2", "bytes": 10}, {"tensor": "h", "bytes": 40}]}}
    path = tmp_path / "contrast.svg"
    meta = figures.contrast_figure(ev, contrast, ["p1"], moved, str(path))
    svg = path.read_text()
    assert "interpret mode on the host" in svg and "moe_unfused" in svg
    assert "moe_fused: 3 launches, a2 10 B (20 B of memory traffic)" in meta["caption"]
    assert "moe_unfused: 4 launches, a2 10 B, h 40 B (100 B of memory traffic)" in meta["caption"]
    assert "median moe_unfused / moe_fused = 1.5" in meta["caption"]
    assert "not a paired comparison" in meta["caption"]


def test_a_contrast_never_timed_together_is_withheld_with_why():
    ev = _evidence({("moe_fused", "p1"): _timed(2.0),
                    ("moe_unfused", "p2"): _timed(3.0)})
    plans, withheld = figures._contrast_plans(ev, SPEC)
    assert plans == []
    assert withheld == [{"figure": "contrast_fusion", "reason": "moe_fused and moe_unfused "
                         "were not both timed at any point on this target"}]
