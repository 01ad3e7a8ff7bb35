"""Case 03's build records on a host with part of the CUDA tools: a binary found (built
here by a host nvcc, or carried) whose SASS cannot be read records that, and builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import contract, cuda_toolkit
from kernels.grouped_gemm_fp8_bf16 import builds, problems, sass, upstream

pytestmark = pytest.mark.host_rehearsal


def test_a_binary_without_a_cuobjdump_to_read_it_is_built_its_sass_not_read(monkeypatch,
                                                                             tmp_path):
    binary = tmp_path / "ex69_harness"
    binary.write_bytes(b"\x7fELF")
    kernel = {"threads": 384, "registers_per_thread": 168, "dynamic_smem_bytes": 1024,
              "stages": 19}
    monkeypatch.setattr(upstream, "build", lambda build_dir: {
        "built": True, "cached": True, "compile_seconds": 0.0, "nvcc": "Build cuda_13.0",
        "binary": str(binary), "library": str(tmp_path / "libex69.so"),
        "kernels": {"convert_only": kernel, "scale_only": kernel}})
    real_tool = cuda_toolkit.tool
    monkeypatch.setattr(cuda_toolkit, "tool",
                        lambda name: None if name == "cuobjdump" else real_tool(name))
    monkeypatch.setattr(sass, "read", lambda *args: pytest.fail("no cuobjdump to run"))
    problem = problems.from_params({"m": [64, 64], "n": 128, "k": 128, "chunk": 128,
                                    "mode": "convert_only"})
    (artifact,) = builds.build("cutlass_ex69", problem, str(tmp_path))["artifacts"]
    facts = artifact["facts"]
    assert "sass" not in facts and facts["stages"] == 19
    assert facts["sass_not_read"] == f"no cuobjdump on this host to disassemble {binary.name}"
    found = {}
    monkeypatch.setattr(cuda_toolkit, "tool", lambda name: Path("/bin/true"))
    monkeypatch.setattr(sass, "read", lambda path, name: found.setdefault(path, name) and {})
    assert builds.build("cutlass_ex69", problem, str(tmp_path))["artifacts"][0]["facts"][
        "sass"] == {} and found == {binary: upstream.KERNEL_NAMES["convert_only"]}


def test_a_tpu_host_without_the_cuda_wheels_records_example_69_not_built(monkeypatch, tmp_path):
    """The TPU host has an nvcc on its PATH but not the lock's CUDA wheels: the C++
    reference is not compiled there (minutes of a device window, for a binary it cannot
    run), and the record says where it is built."""
    monkeypatch.setenv(contract.TARGET_PLATFORM, "tpu")
    monkeypatch.setattr(cuda_toolkit, "CUDA_ROOT", None)
    monkeypatch.setattr(upstream, "build", lambda build_dir: pytest.fail("compiled on a TPU"))
    problem = problems.from_params({"m": [64], "n": 128, "k": 128, "chunk": 128,
                                    "mode": "scale_only"})
    built = builds.build("cutlass_ex69", problem, str(tmp_path))
    assert built["artifacts"] == [] and "not carried to a TPU host" in built["not_built"]
    monkeypatch.setenv(contract.TARGET_PLATFORM, "cpu")
    with pytest.raises(pytest.fail.Exception, match="compiled on a TPU"):
        builds.build("cutlass_ex69", problem, str(tmp_path))


@pytest.mark.parametrize("root", [None, Path("/opt/cu13")])
def test_a_host_nvcc_links_its_own_cudart_where_the_wheels_are_not_installed(monkeypatch,
                                                                             tmp_path, root):
    monkeypatch.setattr(cuda_toolkit, "CUDA_ROOT", root)
    commands = upstream.compile_commands(Path("/usr/bin/nvcc"), tmp_path)
    flags = [str(a) for command in commands[1:] for a in command if str(a).startswith("-L")]
    assert flags == ([] if root is None else [f"-L{root / 'lib'}"] * 2)
    assert not any("None" in str(a) for command in commands for a in command)
