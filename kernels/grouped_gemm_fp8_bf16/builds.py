"""Stage 3 for each variant: what is built, and the resources the build records.

The port and the C++ reference are each compiled once per run (cached in-process, and the
reference also on disk by its inputs' hash); every point of the grid then records the
same binary's facts (and that one compile's seconds), with the point's own tile count.
Dynamic shared memory is checked against the sm_90 limit, so a build over budget fails
naming its point. Each GPU build also records what its SASS does (``sass``), read from the
binary by the same rules for both, so the two kernels compare fact by fact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kernels import contract
from kernels import cuda_toolkit as toolkit
from kernels.grouped_gemm_fp8_bf16 import compile_port, sass, schedule, upstream
from kernels.grouped_gemm_fp8_bf16.problems import GroupedProblem

CUDA_TARGET = "cuda sm_90a"


def _artifact(kind: str, seconds: float, facts: dict[str, Any]) -> dict[str, Any]:
    smem = facts.get("dynamic_smem_bytes")
    if smem is not None and smem > schedule.SMEM_LIMIT_BYTES:
        raise ValueError(f"{smem} bytes of dynamic shared memory exceed the "
                         f"{schedule.SMEM_LIMIT_BYTES}-byte limit")
    return {"target": CUDA_TARGET, "kind": kind, "seconds": seconds,
            "facts": {**facts, "smem_limit_bytes": schedule.SMEM_LIMIT_BYTES}}


def _sass(binary: Path, name_contains: str) -> dict[str, Any]:
    """``sass``: the kernel's SASS facts (``sass.read``), or ``sass_not_read`` where this
    host has no cuobjdump (a binary carried, or built by a host nvcc without the CUDA
    wheels): the build stands, its side-by-side rows are left out."""
    if toolkit.tool("cuobjdump") is None:
        return {"sass_not_read": f"no cuobjdump on this host to disassemble {binary.name}"}
    return {"sass": sass.read(binary, name_contains)}


def build(variant: str, problem: GroupedProblem, build_dir: str) -> dict[str, Any]:
    tiles = int(schedule.tile_offsets(problem.m, problem.n)[-1])
    if variant == "model":
        return {"artifacts": [{"target": "host", "kind": "numpy model (nothing to compile)",
                               "seconds": 0.0, "facts": {"tiles": tiles}}]}
    if variant == "cute_dsl":
        schedule.check(problem)
        if os.environ.get(contract.TARGET_PLATFORM) == "tpu" and not compile_port.dsl_installed():
            return {"artifacts": [], "not_built": "CuTe DSL is not installed on a TPU host: the "
                    "port is compiled for sm_90a on a CPU or GPU host (their build records)"}
        facts = compile_port.build(problem.mode, build_dir)
        return {"artifacts": [_artifact(
            "CuTe DSL kernel compiled ahead of time (fake tensors, --keep-cubin) and exported "
            "with its host launcher as a shared library"
            + (" (carried: compiled where CuTe DSL is installed)" if facts["carried"] else "")
            + (" (reused: compiled once for every point of its mode, from these very sources)"
               if facts.get("reused") else ""),
            facts["compile_seconds"],
            {**facts, "tiles": tiles, **_sass(Path(facts["cubin"]), compile_port.KERNEL_NAME)})]}
    if os.environ.get(contract.TARGET_PLATFORM) == "tpu" and toolkit.CUDA_ROOT is None:
        return {"artifacts": [], "not_built": "the CUDA toolchain is not carried to a TPU "
                "host: example 69 is compiled by nvcc on a CPU or GPU host (their build "
                "records)"}
    built = upstream.build(build_dir)
    if not built["built"]:
        return {"artifacts": [], "not_built": built["reason"]}
    return {"artifacts": [_artifact(
        "CUTLASS example 69 + casebook harness, compiled by nvcc"
        + (" (cached by its inputs' hash)" if built["cached"] else ""),
        built["compile_seconds"],
        {**built["kernels"][problem.mode], "mode": problem.mode, "nvcc": built["nvcc"],
         "cached": built["cached"], "binary": built["binary"], "library": built["library"],
         "tiles": tiles, **_sass(Path(built["binary"]), upstream.KERNEL_NAMES[problem.mode])})]}

