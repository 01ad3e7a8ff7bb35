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

DATA = Path(__file__).parents[1] / "data" / "grouped_gemm_sass"


def read(name: str, contains: str) -> list[sass.Instruction]:
    return sass.kernel((DATA / name).read_text(), contains)


def port() -> list[sass.Instruction]:
    return read("port_scale_only.sass", compile_port.KERNEL_NAME)


def ex69() -> list[sass.Instruction]:
    return read("ex69_scale_only.sass", upstream.KERNEL_NAMES["scale_only"])


def test_the_port_mainloop_as_compiled():
    facts = sass.facts(port())
    assert facts["mainloop_instructions"] == 152  # example 69: 162
    assert facts["hgmma_forms"] == ["HGMMA.64x16x16.F32.BF16"]
    # 4 per K tile in the loop; 8 in the kernel (the loop and its peeled first K tile).
    assert facts["hgmma_per_k_tile"] == 4 and facts["hgmma_in_kernel"] == 8
    assert facts["hgmma_operand_a_in_registers"]
    # A fence per wgmma, each wait leaving three in flight, as the example.
    assert facts["wgmma_fences_per_k_tile"] == 4 and facts["wgmma_wait_depths"] == [3] * 4
    # A try-wait on the next stage after the K tile's last wgmma, then its wait.
    assert facts["barrier_waits_per_k_tile"] == 2 and facts["barrier_arrivals_per_k_tile"] == 1
    # B and its scales, staged by TMA beside B as the example stages them.
    assert facts["shared_loads_per_k_tile"] == {"LDS.U16": 18}
    assert facts["global_loads_per_k_tile"] == {}
    assert facts["local_memory_per_k_tile"] == {} and facts["local_memory_in_kernel"] == {}
    assert facts["runtime_divisions_per_k_tile"] == 0
    # D staged by stmatrix and stored by TMA; a group's partial last M tile from registers.
    assert facts["epilogue"] == "TMA store from shared memory"
    assert facts["epilogue_stores"] == {"STSM.16.MT88.4": 1, "UTMASTG.2D": 1, "STG.E.U16": 8}
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


def test_the_port_converts_each_fp8_pair_as_it_was_loaded():
    """Each fp8 conversion in the port's mainloop reads the register a 2-byte shared load
    wrote, nothing between (the DSL's load of the fp8 vector took every pair apart and
    put it together again, byte by byte: 56 PRMT per K tile); the example repacks with 9."""
    loop = sass.mainloop(port())
    conversions = [n for n, i in enumerate(loop) if i.opcode == "F2FP.F16.E5M2.UNPACK_B"]
    for n in conversions:
        source = int(loop[n].operands.split(",")[1].strip()[1:].split(".")[0])
        writer = max(m for m in range(n) if source in _written(loop[m]))
        assert loop[writer].opcode == "LDS.U16", (loop[n], loop[writer])
    assert len(conversions) == 16
    assert not any(i.opcode == "PRMT" for i in loop)
    assert sum(i.opcode == "PRMT" for i in sass.mainloop(ex69())) == 9


def test_the_port_addresses_each_k_blocks_fp8_pairs_from_one_register():
    """The 16 fp8 loads of a K tile read 4 base registers (one per k-block: the stage's
    offset added once) with immediate offsets k + 8 and n + 8 (8, 0x200, 0x208 bytes), as
    example 69's loads; a swizzle applied to each pair's address took 16 registers and
    an IMAD or LEA each (164 instructions per K tile, now 152)."""
    loads = [i for i in sass.mainloop(port()) if i.opcode == "LDS.U16"]
    fp8 = [i.operands.split("[")[1].rstrip("]") for i in loads if "0x2f" not in i.operands]
    blocks: dict[tuple[str, int], list[int]] = {}
    for address in fp8:  # a register may serve two k-blocks, at offsets 16 bytes apart
        base, _, offset = address.partition("+")
        blocks.setdefault((base, int(offset or "0", 16) & ~0x208), []).append(
            int(offset or "0", 16))
    assert len(fp8) == 16 and len(blocks) == 4 and len({b for b, _ in blocks}) <= 4
    for offsets in blocks.values():
        assert sorted(o - min(offsets) for o in offsets) == [0, 8, 0x200, 0x208]


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


def _written(instruction: sass.Instruction) -> set[int]:
    """The general registers an instruction writes (its first operand, widened by .64,
    .128 and .WIDE); none for stores, barriers, branches and wgmma."""
    if instruction.opcode.startswith(("ST", "SYNCS", "BRA", "WARPGROUP", "HGMMA", "U")):
        return set()
    first = instruction.operands.split(",")[0].strip()
    if not first.startswith("R") or first == "RZ":
        return set()
    width = 4 if ".128" in instruction.opcode else 2 if (
        ".64" in instruction.opcode or ".WIDE" in instruction.opcode) else 1
    return set(range(int(first[1:].split(".")[0]), int(first[1:].split(".")[0]) + width))


@pytest.mark.parametrize("kernel", [port, ex69], ids=["port", "ex69"])
def test_no_register_or_stage_is_reused_while_a_wgmma_may_read_it(kernel):
    """The races pipelining can bring, which no CPU run would show. In the mainloop (a
    cycle: the example's starts at its first wgmma, its registers written at the end of
    the pass before), each wgmma's A registers are written only after a wait that
    retires the wgmma that read them one pass earlier; and the stage is released after a
    wait that leaves in flight only wgmma of this pass, so every wgmma reading the
    previous K tile's stage has retired (both kernels release that one, a K tile
    behind)."""
    loop = sass.mainloop(kernel())
    hgmma = [n for n, i in enumerate(loop) if i.opcode.startswith("HGMMA")]
    waits = [n for n, i in enumerate(loop) if i.opcode == "WARPGROUP.DEPBAR.LE"]

    def depth(wait: int) -> int:
        return int(loop[wait].operands.rsplit(",", 1)[1], 16)

    for n in hgmma:
        base = int(loop[n].operands.split(",")[1].strip()[1:])
        wait = max((w for w in waits if w < n), default=waits[-1])  # cyclically before
        # The wgmma issued after this one's previous pass and before the wait: the wait
        # retires that pass's unless more than these may stay in flight.
        newer = sum(h > n or h < wait if wait < n else n < h < wait for h in hgmma)
        assert depth(wait) <= newer, loop[n]
        writes = [m for m, i in enumerate(loop) if _written(i) & set(range(base, base + 4))]
        between = [wait < m < n if wait < n else m > wait or m < n for m in writes]
        assert writes and all(between), (loop[n], writes)
    (release,) = [n for n, i in enumerate(loop) if i.opcode.startswith("SYNCS.ARRIVE")]
    wait = max(w for w in waits if w < release)
    assert depth(wait) <= sum(h < wait for h in hgmma)


def _mutated(change: str) -> list[sass.Instruction]:
    """The port's SASS with its mainloop made racy (addresses kept in order)."""
    instructions = port()
    loop = sass.mainloop(instructions)
    start = instructions.index(loop[0])
    waits = [i for i in loop if i.opcode == "WARPGROUP.DEPBAR.LE"]
    body = list(loop)
    if change == "release_before_last_wait":
        (release,) = [i for i in body if i.opcode.startswith("SYNCS.ARRIVE")]
        body.remove(release)
        body.insert(body.index(waits[-1]), release)
    elif change.startswith("wait_dropped_"):
        body.remove(waits[int(change[-1])])
    else:  # one more wgmma left in flight at every wait
        body = [sass.Instruction(i.address, i.predicate, i.opcode, i.operands.replace(
            "0x3", "0x4")) if i in waits else i for i in body]
    body = [sass.Instruction(a.address, b.predicate, b.opcode, b.operands)
            for a, b in zip(loop, body, strict=False)]
    return instructions[:start] + body + instructions[start + len(loop):]


@pytest.mark.parametrize("change", ["release_before_last_wait", "wait_dropped_0",
                                    "wait_dropped_3", "depth_4"])
def test_the_race_check_catches_a_racy_mainloop(change):
    with pytest.raises(AssertionError):
        test_no_register_or_stage_is_reused_while_a_wgmma_may_read_it(lambda: _mutated(change))
