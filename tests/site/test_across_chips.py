"""Case 02's reference on its own chip and the port on its GPU, set side by side by
fraction of each chip's speed of light at the same problem (the case's ``across_chips``),
never by time; the case config names real, distinct variants."""

from __future__ import annotations

import pytest

from casebook.core import config, provenance
from casebook.core.errors import CasebookError
from casebook.report import page_tables
from casebook.report.evidence import Evidence
from tests.projects import cases_with

SPEC = {"points": [{"name": "p"}, {"name": "q"}], "build_only_points": [{"name": "big"}],
        "across_chips": [{"reference": "ref", "port": ["port", "port_tiles"]}]}
DEVICE = {"mode": "m", "interpret": False, "poisoned": False, "race_detection": False}


def timed(median: float, sol: float | None) -> dict:
    return {"timed": True, "execution": DEVICE, "measurement": {"median_s": median},
            **({"speed_of_light": {"fraction": sol}} if sol is not None else {})}


def target(name: str, times: dict) -> Evidence:
    return Evidence(case="c", target=name, spec=SPEC, env={}, host={"gpus": [], "cpu": {}},
                    builds={}, verify={}, time=times, baselines={}, sources=[],
                    kernel_sources_sha256="s", noise_floor=None, check_power={})


def test_a_problem_both_were_device_timed_at_is_one_row_of_each_chips_fraction():
    tpu = target("tpu-v5e", {("ref", "p"): timed(2.4e-3, 0.578), ("ref", "big"): timed(3e-2, 0.6)})
    gpu = target("h200", {("port", "p"): timed(9e-6, 0.42), ("port_tiles", "p"): timed(8e-6, None),
                          ("port", "q"): timed(9e-6, 0.3)})
    table = page_tables.across_chips([tpu, gpu], SPEC)["table"]
    assert table.count("<tr>") == 2  # the header and point p: q and big have one side only
    assert "ref on tpu-v5e: 2.4 ms, 57.8% of SOL" in table
    assert "port on h200: 9 µs, 42.0% of SOL" in table and "port_tiles" not in table


def test_without_a_common_problem_the_page_says_where_each_side_was_timed():
    tpu = target("tpu-v5e", {("ref", "big"): timed(3e-2, 0.6)})
    gpu = target("h200", {("port", "q"): timed(9e-6, 0.3), ("ref", "p"): timed(1e-3, None)})
    said = page_tables.across_chips([tpu, gpu], SPEC)
    assert said == {"none": "No problem has both the reference and the port device-timed "
                            "with a fraction of the speed of light yet. Device-timed so: "
                            "ref on tpu-v5e at big; port on h200 at q; port_tiles at none."}
    assert page_tables.across_chips([tpu, gpu], {**SPEC, "across_chips": []}) is None


@pytest.mark.parametrize(("pair", "key", "why"), [
    ({"reference": "upstrem", "port": ["mgpu"]}, "across_chips.0.reference",
     "no variant named 'upstrem'"),
    ({"reference": "upstream", "port": ["mgpu", "mgpu_fast"]}, "across_chips.0.port.1",
     "no variant named 'mgpu_fast'"),
    ({"reference": "upstream", "port": ["upstream"]}, "across_chips.0.port",
     "the reference against itself")])
def test_a_pair_names_real_distinct_variants(tmp_path, pair, key, why):
    with pytest.raises(CasebookError, match=f"{key}: {why}"):
        config.load_case(cases_with(tmp_path, "splash_attention", "across_chips", [pair]),
                         "splash_attention")


def test_the_pairs_are_presentation_no_record_goes_stale_for_them(tmp_path):
    spec = config.load_case("configs/cases", "splash_attention")
    assert spec["across_chips"]
    bare = {k: v for k, v in spec.items() if k != "across_chips"}
    assert provenance.job_slice(spec, "upstream", "s8k_d128_causal") == \
        provenance.job_slice(bare, "upstream", "s8k_d128_causal")
