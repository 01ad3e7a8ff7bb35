"""Case 03's C++ reference: CUTLASS example 69 and our harness, compiled once for sm_90a.

The compile takes ~2 minutes and ~5 GB on 2 cores, so this module compiles it once (a
module fixture) and checks everything on that one binary; the pipeline's build stage
compiles it again in its own build tree (tests/test_workflow.py does not include this
variant). The binary itself runs here only as --resources (host code, no GPU), and its
library (libex69.so) is loaded, not called."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from kernels.grouped_gemm_fp8_bf16 import reference, schedule

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    build_dir = str(tmp_path_factory.mktemp("build"))
    return build_dir, reference.build(build_dir)


def test_example_69_compiles_for_sm90a_with_its_resources(built):
    _, facts = built
    assert facts["built"] and not facts["cached"], facts
    assert facts["nvcc"].startswith("Build cuda_13.0")
    assert "arch=compute_90a,code=sm_90a" in facts["flags"]
    for mode in ("convert_only", "scale_only"):
        kernel = facts["kernels"][mode]
        assert 0 < kernel["dynamic_smem_bytes"] <= schedule.SMEM_LIMIT_BYTES
        assert kernel["threads"] == 384 and kernel["stages"] > 1
        assert 0 < kernel["registers_per_thread"] <= 255 and kernel["local_bytes"] == 0
        assert set(kernel["sass_mma"]) == {"HGMMA.64x16x16.F32.BF16"}
    # The library the GPU host times through exports the harness's C entry points.
    library = ctypes.CDLL(facts["library"])
    for name in ("ex69_create", "ex69_run", "ex69_destroy", "ex69_last_error"):
        assert callable(getattr(library, name))
    # ScaleOnly keeps scales in shared memory beside B: fewer stages fit.
    assert facts["kernels"]["scale_only"]["stages"] < facts["kernels"]["convert_only"]["stages"]


def test_a_second_build_is_found_by_its_inputs_hash(built):
    build_dir, first = built
    again = reference.build.__wrapped__(build_dir)
    assert again["cached"] and again["binary"] == first["binary"]
    assert Path(first["binary"]).parent.name == reference.cache_key(first["nvcc"])
    assert reference.cache_key("another nvcc") != reference.cache_key(first["nvcc"])


def test_without_nvcc_the_build_says_so(tmp_path):
    facts = reference.build.__wrapped__(str(tmp_path), tmp_path / "no-nvcc")
    assert not facts["built"] and "nvcc not found" in facts["reason"]


def test_a_build_of_the_same_sources_by_another_nvcc_is_used_not_recompiled(built, tmp_path,
                                                                            monkeypatch):
    """An offline GPU host: its own nvcc (or none) and the build carried from here."""
    build_dir, first = built
    other = tmp_path / "nvcc"
    other.write_text("#!/bin/sh\necho 'Build cuda_13.9.r13.9/compiler.0'\n")
    other.chmod(0o755)
    for nvcc in (other, None):
        found = reference.build.__wrapped__(build_dir, nvcc)
        assert found["cached"] and found["binary"] == first["binary"]
        assert found["nvcc"] == first["nvcc"]  # names the compiler that built it
    monkeypatch.setattr(reference, "sources_key", lambda: "other sources")
    facts = reference.build.__wrapped__(build_dir, None)
    assert not facts["built"] and "nvcc not found" in facts["reason"]
