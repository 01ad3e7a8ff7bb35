"""Case 03's SASS facts (kernels/grouped_gemm_fp8_bf16/sass.py) on real SASS.

The fixtures under tests/data/grouped_gemm_sass/ are lines captured by ``cuobjdump -sass``
from the two ScaleOnly kernels as built now (the port's cubin, example 69's harness with
nvcc 13.0): each mainloop whole, with its addresses, and every kernel-wide line the facts
read (setmaxnreg, TMA loads and stores, stores, local memory, HGMMA outside the mainloop);
encodings stripped. test_grouped_gemm_port.py and test_grouped_gemm_reference.py check
each fixture's facts against a fresh build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.grouped_gemm_fp8_bf16 import compile_port, sass, upstream

DATA = Path(__file__).parent / "data" / "grouped_gemm_sass"


def read(name: str, contains: str) -> list[sass.Instruction]:
    return sass.kernel((DATA / name).read_text(), contains)


def port() -> list[sass.Instruction]:
    return read("port_scale_only.sass", compile_port.KERNEL_NAME)


def ex69() -> list[sass.Instruction]:
    return read("ex69_scale_only.sass", upstream.KERNEL_NAMES["scale_only"])


def test_the_port_mainloop_as_compiled():
    facts = sass.facts(port())
    assert facts["mainloop_instructions"] == 205
    assert facts["hgmma_forms"] == ["HGMMA.64x16x16.F32.BF16"]
    assert facts["hgmma_per_k_tile"] == 4 and facts["hgmma_in_kernel"] == 4
    assert facts["hgmma_operand_a_in_registers"]
    # One fence before all four wgmma, then wait until none is in flight.
    assert facts["wgmma_fences_per_k_tile"] == 1 and facts["wgmma_wait_depths"] == [0]
    # B and its scales, staged by TMA beside B as the example stages them.
    assert facts["shared_loads_per_k_tile"] == {"LDS.U16": 18}
    assert facts["global_loads_per_k_tile"] == {}
    assert facts["local_memory_per_k_tile"] == {} and facts["local_memory_in_kernel"] == {}
    assert facts["runtime_divisions_per_k_tile"] == 0
    assert facts["epilogue"] == "stores to global memory from registers"
    assert facts["epilogue_stores"] == {"STG.E.U16": 8}
    assert facts["register_split"] == {"DEALLOC": 40, "TRY_ALLOC": 232}
    assert facts["tma_descriptor_updates"] == 0


def test_example_69_mainloop_as_compiled():
    facts = sass.facts(ex69())
    assert facts["mainloop_instructions"] == 162
    assert facts["hgmma_forms"] == ["HGMMA.64x16x16.F32.BF16"]
    # 4 per K tile in the loop; 12 in the kernel (the loop and its peeled copies).
    assert facts["hgmma_per_k_tile"] == 4 and facts["hgmma_in_kernel"] == 12
    # A fence per wgmma, each wait leaving three in flight: conversion overlaps the MMA.
    assert facts["wgmma_fences_per_k_tile"] == 4 and facts["wgmma_wait_depths"] == [3] * 4
    assert facts["shared_loads_per_k_tile"] == {"LDS.U16": 18}  # B and its scales
    assert facts["global_loads_per_k_tile"] == {} and facts["local_memory_per_k_tile"] == {}
    assert facts["runtime_divisions_per_k_tile"] == 0
    assert facts["epilogue"] == "TMA store from shared memory"
    assert facts["epilogue_stores"] == {"STSM.16.MT88.4": 1, "UTMASTG.2D": 2}
    assert facts["tma_descriptor_updates"] == 5


def test_both_convert_alike_per_k_tile():
    port_facts, ex69_facts = sass.facts(port()), sass.facts(ex69())
    for key in (
        "fp8_unpacks_per_k_tile",
        "f16_to_f32_per_k_tile",
        "bf16_packs_per_k_tile",
        "scale_multiplies_per_k_tile",
    ):
        assert port_facts[key] == ex69_facts[key] > 0, key


def test_the_mainloop_is_the_innermost_loop_holding_hgmma():
    instructions = port()
    loop = sass.mainloop(instructions)
    assert loop[-1].opcode == "BRA" and loop[0].address < loop[-1].address
    # Without its backward branch the kernel has no mainloop.
    unrolled = [i for i in instructions if i is not loop[-1]]
    with pytest.raises(ValueError, match="no loop holds an HGMMA"):
        sass.mainloop(unrolled)


def test_a_kernel_name_must_match_exactly_one_function():
    text = (DATA / "port_scale_only.sass").read_text()
    with pytest.raises(ValueError, match="0 functions"):
        sass.kernel(text, "no such kernel")
    with pytest.raises(ValueError, match="2 functions"):
        sass.kernel(text + text.replace(": kernel_", ": copy_kernel_"), compile_port.KERNEL_NAME)
