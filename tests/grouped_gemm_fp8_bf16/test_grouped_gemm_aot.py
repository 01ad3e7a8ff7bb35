"""Case 03's port exported ahead of time: a library that needs no CuTe DSL, the launch ABI
read from its header, tensor arguments laid out byte for byte as the DSL lays them out,
and the carried export taken only for the sources it was compiled from. Where CuTe DSL is
not installed (the rehearsal of the GPU host), the export carried into the build tree
(`make gpu-host`) is what is checked."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from casebook.core import paths
from kernels import grouped_gemm_fp8_bf16 as case
from kernels.grouped_gemm_fp8_bf16 import aot, compile_port, device
from kernels.grouped_gemm_fp8_bf16.problems import MODES

pytestmark = [pytest.mark.compile, pytest.mark.host_rehearsal]

needs_dsl = pytest.mark.skipif(not compile_port.dsl_installed(),
                               reason="CuTe DSL is not installed: nothing is compiled here")
EXPECTED = [("b", 3, 2), ("a", 2, 1), ("scale", 3, 2), ("c", 2, 1), ("d", 2, 1),
            ("row_offsets", 1, 0), ("tile_offsets", 1, 0)]
# Shared libraries the exported port may need at run time: the C library and the loader.
SYSTEM = ("linux-vdso", "libc.so", "ld-linux", "libm.so", "libdl.so", "libpthread.so",
          "librt.so", "libgcc_s.so", "libstdc++.so")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Both modes compiled here, or (without CuTe DSL) the export carried into build/."""
    folder = str(tmp_path_factory.mktemp("build")) if compile_port.dsl_installed() \
        else paths.build_dir(case.CASE)
    try:
        return {mode: compile_port.build(mode, folder) for mode in MODES}
    finally:
        compile_port.build.cache_clear()


@pytest.mark.parametrize("mode", MODES)
def test_the_export_is_a_library_that_needs_only_libc_and_the_driver(exported, mode):
    facts = exported[mode]
    assert facts["carried"] is not compile_port.dsl_installed()
    assert facts["compiled_with"] == "nvidia-cutlass-dsl 4.8.1"
    assert facts["sources_sha256"] == compile_port.sources_sha256()
    tensors = [(a["name"], a["shapes"], a["strides"]) for a in facts["abi"]["arguments"]
               if a["kind"] == "tensor"]
    assert tensors == EXPECTED
    scalars = [(a["name"], a["kind"]) for a in facts["abi"]["arguments"] if a["kind"] != "tensor"]
    assert scalars == [("alpha", "float"), ("beta", "float"), ("chunk", "int32_t"),
                       ("grid_ctas", "int32_t"), ("stream", "cudaStream_t")]
    needed = subprocess.run(["ldd", facts["library"]], capture_output=True, text=True,
                            check=True).stdout
    libraries = [Path(line.split()[0]).name for line in needed.splitlines() if line.strip()]
    assert libraries and all(name.startswith(SYSTEM) for name in libraries), needed
    assert "not found" not in needed


def test_without_a_gpu_the_library_loads_and_reports_the_missing_driver(exported):
    facts = exported["scale_only"]
    code = ("import json, sys\nfrom kernels.grouped_gemm_fp8_bf16 import aot\n"
            f"facts = json.loads({json.dumps(json.dumps(facts))})\n"
            "try:\n    aot.Launcher(facts['library'], facts['abi'], 1)\n"
            "except RuntimeError as error:\n    print(error)\n    sys.exit(0)\nsys.exit(1)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert "module init failed with CUDA error" in done.stdout


@needs_dsl
def test_tensor_arguments_match_the_dsls_own_descriptors_byte_for_byte(exported):
    from cutlass.cute.runtime import from_dlpack

    rng = np.random.default_rng()
    for argument in exported["convert_only"]["abi"]["arguments"]:
        if argument["kind"] != "tensor":
            continue
        shape = tuple(int(x) for x in rng.integers(1, 9, argument["shapes"]) * 16)
        array = np.zeros(shape, np.int32 if argument["shapes"] == 1 else np.float16)
        theirs = from_dlpack(array, assumed_align=16).mark_layout_dynamic(
            leading_dim=array.ndim - 1)
        ours = aot.tensor_value(argument, array.ctypes.data, shape,
                                device.row_major_strides(shape))
        # Field by field: the padding between fields (after an odd count of 32-bit
        # extents) is never read, and the DSL leaves it uninitialised.
        base = theirs.__c_pointers__()[0]
        fields = [(name, getattr(type(ours), name)) for name, _ in ours._fields_]
        assert sum(f.size for _, f in fields) > 0
        for name, field in fields:
            assert (ctypes.string_at(base + field.offset, field.size)
                    == bytes(ours)[field.offset:field.offset + field.size]), (argument, name)


def test_a_tensor_of_another_rank_or_layout_is_refused():
    argument = {"name": "b", "kind": "tensor", "shapes": 3, "strides": 2}
    with pytest.raises(ValueError, match="b: shape"):
        aot.tensor_value(argument, 0, (4, 16), (16, 1))
    with pytest.raises(ValueError, match="b: shape"):
        aot.tensor_value(argument, 0, (2, 4, 16), (64, 1, 4))  # not row-major


@needs_dsl
def test_a_carried_export_is_taken_only_for_its_own_sources(exported, monkeypatch, tmp_path):
    monkeypatch.setattr(compile_port, "dsl_installed", lambda: False)
    library = exported["scale_only"]["library"]
    build_dir = library.rsplit("/cute_dsl/", 1)[0]
    try:
        carried = compile_port.build("scale_only", build_dir)
        assert carried["carried"] and carried["library"] == library
        assert carried["registers_per_thread"] == exported["scale_only"]["registers_per_thread"]
        compile_port.build.cache_clear()
        monkeypatch.setattr(compile_port, "sources_sha256", lambda: "0" * 64)
        with pytest.raises(RuntimeError, match="holds no export of these port sources"):
            compile_port.build("scale_only", build_dir)
        compile_port.build.cache_clear()
        with pytest.raises(RuntimeError, match="holds no export"):
            compile_port.build("scale_only", str(tmp_path))
    finally:
        compile_port.build.cache_clear()


def test_row_major_strides():
    assert device.row_major_strides((3, 5, 7)) == (35, 7, 1)
    assert device.row_major_strides((9,)) == (1,)
