"""Case 03 end to end on a CPU host: the whole DAG on one point, in a copy of the sources.

The model is verified and timed; the port is compiled for sm_90a and, with no GPU here,
recorded as not run; the page says kernel verification needs an sm_90 GPU. The C++
reference's nvcc build (~2 min, ~5 GB) is exercised once, by test_grouped_gemm_reference.py
beside this file, and by the full pipeline (`make`), not here.
"""

from __future__ import annotations

import json

import pytest
import yaml

from casebook.core import paths
from kernels import grouped_gemm_fp8_bf16 as case
from tests.projects import make_project, snakemake

pytestmark = [pytest.mark.e2e, pytest.mark.compile, pytest.mark.timeout(900)]
RESULTS = f"results/cpu/{case.CASE}"


def tiny_grouped_case() -> dict:
    spec = yaml.safe_load((paths.SOURCE_ROOT / f"configs/cases/{case.CASE}.yaml").read_text())
    spec["points"] = [p for p in spec["points"] if p["name"] == "epilogue_multichunk"]
    spec["build_only_points"] = spec["build_only_points"][:1]
    spec["variants"] = [v for v in spec["variants"] if v["name"] != "cutlass_ex69"]
    del spec["side_by_side"]  # it names cutlass_ex69 (test_grouped_gemm_bit_exact.py)
    spec["verify"]["trials"] = 1
    return spec


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("e2e_grouped"), tiny_grouped_case())
    done = snakemake(project)
    assert done.returncode == 0, done.stderr[-4000:]
    return project


def test_the_model_is_verified_against_the_oracle_within_the_bound(project):
    record = json.loads((project / RESULTS / "verify/model/epilogue_multichunk.json")
                        .read_text())
    assert record["ran"] and record["passed"], record["failures"]
    for check in record["checks"]:
        out = check["outputs"]["out"]
        assert 0 < out["worst_error_over_tolerance"] <= 1
        assert out["atol_applied"]["max"] > 0 and "example_rule_failures" in out


def test_the_port_is_built_and_honestly_not_run(project):
    build = json.loads((project / RESULTS / "build/cute_dsl.json").read_text())
    assert build["ok"] and [p["build_only"] for p in build["points"]] == [False, True]
    facts = build["points"][0]["artifacts"][0]["facts"]
    assert "HGMMA.64x16x16.F32.BF16" in facts["sass_mma"]
    assert facts["dynamic_smem_bytes"] <= facts["smem_limit_bytes"]
    verify = json.loads((project / RESULTS / "verify/cute_dsl/epilogue_multichunk.json")
                        .read_text())
    assert not verify["ran"] and verify["not_run_reason"] == case.NO_GPU
    timed = json.loads((project / RESULTS / "time/cute_dsl/epilogue_multichunk.json")
                       .read_text())
    assert not timed["timed"] and case.NO_GPU in timed["not_timed_reason"]
    page = (project / f"site/public/{case.CASE}.html").read_text()
    assert f"not run here: {case.NO_GPU}" in page  # the record's reason, shown
    assert (project / f"results/figures/{case.CASE}/cpu/build.svg").exists()
