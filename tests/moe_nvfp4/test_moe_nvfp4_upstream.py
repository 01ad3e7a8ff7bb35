"""Case 01's reference compiled: FlashInfer's masked NVFP4 grouped GEMM (CuTe DSL) built
for sm_100a on this CPU-only host, torch never imported, its launch read from the
compile (the launch call, the kernel object, the cubin and its PTX), recorded as the
build of the variant ``reference_flashinfer`` and never run."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

import kernels.moe_nvfp4 as case
from casebook.core import config, records
from casebook.stages import build
from kernels import contract
from kernels.moe_nvfp4 import upstream

SPEC = config.load_case("configs/cases", "moe_nvfp4")
SMALL = SPEC["points"][0]
needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="CuTe DSL is not installed: nothing is compiled here")


def test_the_entrys_default_tiles_are_read_from_the_pinned_source(tmp_path):
    assert upstream.wrapper_defaults(upstream.source()) == {
        "mma_tiler_mn": (128, 128), "cluster_shape_mn": (1, 1)}
    text = upstream.source().read_text()
    changed = tmp_path / "changed.py"
    changed.write_text(text.replace('kwargs.pop("mma_tiler_mn", (128, 128))',
                                    'kwargs.pop("mma_tiler_mn", (256, 128))'))
    assert upstream.wrapper_defaults(changed)["mma_tiler_mn"] == (256, 128)
    gone = tmp_path / "gone.py"
    gone.write_text(text.replace("kwargs.pop(", "kwargs.get("))
    with pytest.raises(ValueError, match="no longer defaults mma_tiler_mn"):
        upstream.wrapper_defaults(gone)


@pytest.mark.compile
@pytest.mark.timeout(300)
@needs_dsl
def test_the_reference_compiles_at_each_gemm_and_its_launch_is_read(tmp_path):
    """At the smallest point, through the pipeline's own lowering stage: a schema-valid
    record with GEMM1 and GEMM2, each a persistent launch of min(148, tiles) CTAs of 192
    threads on the block-scaled NVFP4 MMA, its facts read from the compile."""
    out = str(tmp_path / "lowered.json")
    record = build.lower("configs/cases", "moe_nvfp4", upstream.VARIANT,
                         SMALL["name"], "cpu", out)
    assert records.read(out, "lowering") == record
    params = SMALL["params"]
    e, m, k, n = params["experts"], params["m"], params["hidden"], params["inter"]
    stages = record["built"]["artifacts"]
    assert [a["facts"]["kernel"] for a in stages] == ["gemm1", "gemm2"]
    for artifact, (cols, _) in zip(stages, ((2 * n, k), (k, n)), strict=True):
        facts = artifact["facts"]
        tiles = [m // 128, cols // 128, e]
        assert artifact["target"] == "cuda sm_100a"
        assert facts["tile_schedule"]["tiles_per_dim_mnl"] == tiles
        assert facts["tile_schedule"]["tile_clusters_at_capacity"] == math.prod(tiles)
        assert facts["grid"] == [1, 1, min(upstream.TARGET_SMS, math.prod(tiles))]
        assert facts["block"] == [192, 1, 1] and facts["cluster"] == [1, 1, 1]
        assert 0 < facts["dynamic_smem_bytes"] <= facts["smem_limit_bytes"] == 232_448
        assert 0 < facts["registers_per_thread"] <= 255
        assert facts["tmem_columns"] <= facts["tmem_limit_columns"] == 512
        (mma,) = facts["tcgen05_mma"]
        assert "kind::mxf4nvf4.block_scale" in mma
        assert facts["tuning"]["mma_tiler_mn"] == "128x128"
    assert "torch" not in sys.modules  # the compile ran in a child process


@pytest.mark.compile
@pytest.mark.timeout(300)
@needs_dsl
def test_at_the_upstream_benchmark_shape_every_b200_sm_holds_one_persistent_cta():
    """GEMM1 of groups 6, m 1408 (expected_m 1024), n 4096, k 7168: 2,112 tiles at
    capacity walked by 148 CTAs, one per SM."""
    facts = upstream.compile_launch(6, 1408, 4096, 7168)
    assert facts["grid"] == [1, 1, 148]
    assert facts["tile_schedule"] == {"persistent_ctas": 148, "cta_tile": [128, 128],
                                      "tiles_per_dim_mnl": [11, 32, 6],
                                      "tile_clusters_at_capacity": 2112}


def test_the_reference_runs_nowhere_here_and_says_why():
    assert case.outputs(upstream.VARIANT) == ("h", "out")
    with pytest.raises(contract.NotRunnable, match=r"for sm_100a on a CPU host.*never run"):
        case.kernel(upstream.VARIANT, SMALL["params"], "check")
    assert upstream.VARIANT in {v["name"] for v in SPEC["variants"]}


@needs_dsl
def test_a_failed_compile_names_the_shape_and_the_compilers_message():
    with pytest.raises(ValueError, match=r"\(groups, m, n, k\) = \(1, 128, 100, 256\) failed"):
        upstream.compile_launch(1, 128, 100, 256)


def test_a_host_without_cute_dsl_records_why_it_compiled_nothing(monkeypatch):
    """An offline GPU host carries no CuTe DSL: its build of the reference is empty and
    says why, rather than failing the point's jobs."""
    found = upstream.importlib.util.find_spec
    monkeypatch.setattr(upstream.importlib.util, "find_spec",
                        lambda name: None if name == "cutlass" else found(name))
    built = case.build(upstream.VARIANT, SMALL["params"])
    assert built["artifacts"] == [] and "CuTe DSL is not installed" in built["not_compiled_here"]
