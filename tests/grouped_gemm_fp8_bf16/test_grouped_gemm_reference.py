"""Case 03's C++ reference: CUTLASS example 69 and our harness, compiled once for sm_90a.

The compile takes ~2 minutes and ~5 GB on 2 cores, so this module builds it once (a
module fixture) and checks everything on that one binary. The build is kept per user by
its inputs' hash (``upstream.user_cache``): where this user already compiled these
sources with this nvcc (in CI: ``make gpu-host``, just before), the fixture copies that
build, and the facts of the copy are checked against the binary itself. The binary runs
here only as --resources (host code, no GPU), and its library (libex69.so) is loaded,
not called."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

from kernels.grouped_gemm_fp8_bf16 import port, sass, schedule, upstream

pytestmark = [pytest.mark.compile, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    build_dir = str(tmp_path_factory.mktemp("build"))
    return build_dir, upstream.build(build_dir)


def test_example_69_compiles_for_sm90a_with_its_resources(built):
    _, facts = built
    assert facts["built"], facts
    # Compiled now, or kept from a compile of the same key: the facts are the binary's.
    assert upstream._resources(Path(facts["binary"])) == facts["kernels"]
    assert facts["nvcc"].startswith("Build cuda_13.0")
    assert "arch=compute_90a,code=sm_90a" in facts["flags"]
    for mode in ("convert_only", "scale_only"):
        kernel = facts["kernels"][mode]
        assert 0 < kernel["dynamic_smem_bytes"] <= schedule.SMEM_LIMIT_BYTES
        assert kernel["threads"] == 384 and kernel["stages"] > 1
        # The port's ring is sized by this kernel's builder rule (port.stage_count).
        assert kernel["stages"] == port.GroupedMixedGemm(mode == "scale_only").stages
        assert 0 < kernel["registers_per_thread"] <= 255 and kernel["local_bytes"] == 0
        assert set(kernel["sass_mma"]) == {"HGMMA.64x16x16.F32.BF16"}
    # The library the GPU host times through exports the harness's C entry points.
    library = ctypes.CDLL(facts["library"])
    for name in ("ex69_create", "ex69_run", "ex69_destroy", "ex69_last_error"):
        assert callable(getattr(library, name))
    # The SASS fixture of its ScaleOnly kernel (test_grouped_gemm_sass.py) is this
    # binary's: the same facts.
    fixture = Path(__file__).parents[1] / "data" / "grouped_gemm_sass" / "ex69_scale_only.sass"
    name = upstream.KERNEL_NAMES["scale_only"]
    assert sass.read(Path(facts["binary"]), name) == sass.facts(
        sass.kernel(fixture.read_text(), name))
    # ScaleOnly keeps scales in shared memory beside B: fewer stages fit.
    assert facts["kernels"]["scale_only"]["stages"] < facts["kernels"]["convert_only"]["stages"]


def test_a_second_build_is_found_by_its_inputs_hash(built):
    build_dir, first = built
    again = upstream.build.__wrapped__(build_dir)
    assert again["cached"] and again["binary"] == first["binary"]
    assert Path(first["binary"]).parent.name == upstream.cache_key(first["nvcc"])
    assert upstream.cache_key("another nvcc") != upstream.cache_key(first["nvcc"])


def test_a_fresh_clone_finds_the_users_build_by_its_inputs_hash(built, tmp_path,
                                                                   monkeypatch):
    """Kept per user at the first build; a build tree without it copies it, and its facts
    name the copy."""
    _, first = built
    monkeypatch.setenv("CASEBOOK_CACHE", str(tmp_path / "cache"))
    upstream._keep_for_user(Path(first["binary"]).parent)
    kept = tmp_path / "cache/ex69" / Path(first["binary"]).parent.name
    assert (kept / "ex69_harness").read_bytes() == Path(first["binary"]).read_bytes()
    clone = tmp_path / "clone"
    found = upstream.build.__wrapped__(str(clone))
    assert found["cached"] and found["nvcc"] == first["nvcc"]
    assert Path(found["binary"]) == clone / "ex69" / kept.name / "ex69_harness"
    assert Path(found["binary"]).read_bytes() == Path(first["binary"]).read_bytes()
    assert upstream.build.__wrapped__(str(clone))["binary"] == found["binary"]
    shutil.rmtree(kept)  # gone from the cache: the clone's own copy still serves
    assert upstream.build.__wrapped__(str(clone))["binary"] == found["binary"]


def test_without_nvcc_the_build_says_so(tmp_path):
    facts = upstream.build.__wrapped__(str(tmp_path), tmp_path / "no-nvcc")
    assert not facts["built"] and "nvcc not found" in facts["reason"]


def test_a_build_of_the_same_sources_by_another_nvcc_is_used_not_recompiled(built, tmp_path,
                                                                            monkeypatch):
    """An offline GPU host: its own nvcc (or none) and the build carried from here."""
    build_dir, first = built
    other = tmp_path / "nvcc"
    other.write_text("#!/bin/sh\necho 'Build cuda_13.9.r13.9/compiler.0'\n")
    other.chmod(0o755)
    for nvcc in (other, None):
        found = upstream.build.__wrapped__(build_dir, nvcc)
        assert found["cached"] and found["binary"] == first["binary"]
        assert found["nvcc"] == first["nvcc"]  # names the compiler that built it
    monkeypatch.setattr(upstream, "sources_key", lambda: "other sources")
    facts = upstream.build.__wrapped__(build_dir, None)
    assert not facts["built"] and "nvcc not found" in facts["reason"]
