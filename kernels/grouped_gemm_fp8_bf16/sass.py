"""What a compiled grouped GEMM does, read from its SASS (``cuobjdump -sass``).

The mainloop is the innermost loop (a backward branch) that holds the kernel's HGMMA
instructions: one pass of it consumes one K tile from the shared-memory ring. ``facts``
counts, in that loop, the wgmma instructions, their fences and waits, the fp8 → bf16
conversion and the scale multiplies, the loads by kind and width, the ring's barrier
waits and arrivals, local-memory traffic and runtime divisions; and, over the whole
kernel, the TMA loads and stores, the register split of the warp roles (setmaxnreg)
and the epilogue's path. Both kernels of case 03 are read by the same rules, so their
facts compare one to one. Standard library only.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from kernels import cuda_toolkit as toolkit

# "/*3820*/  @!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R13 ;" (encoding comment optional)
_LINE = re.compile(
    r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:(@!?U?P[T0-9]+)\s+)?([A-Z][A-Za-z0-9_.]*)"
    r"\s*([^;]*);"
)
_TARGET = re.compile(r"\b0x([0-9a-f]+)\b")
_FUNCTION = "\t\tFunction : "


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str | None
    opcode: str
    operands: str


def functions(sass: str) -> dict[str, list[Instruction]]:
    """Every function of a ``cuobjdump -sass`` listing: its (mangled) name to its
    instructions in address order."""
    found = {}
    for part in sass.split(_FUNCTION)[1:]:
        name, body = part.split("\n", 1) if "\n" in part else (part, "")
        found[name.strip()] = [
            Instruction(int(m[1], 16), m[2], m[3], m[4].strip())
            for m in map(_LINE.match, body.splitlines())
            if m
        ]
    return found


def kernel(sass: str, name_contains: str) -> list[Instruction]:
    """The instructions of the one function whose name contains ``name_contains``."""
    matches = [body for name, body in functions(sass).items() if name_contains in name]
    if len(matches) != 1:
        raise ValueError(
            f"{len(matches)} functions in the SASS contain {name_contains!r}; expected exactly one"
        )
    return matches[0]


def mainloop(instructions: list[Instruction]) -> list[Instruction]:
    """The innermost loop holding HGMMA: from a backward branch's target to the branch."""
    loops = []
    for branch in instructions:
        target = _TARGET.search(branch.operands) if branch.opcode == "BRA" else None
        if target and int(target[1], 16) < branch.address:
            body = [i for i in instructions if int(target[1], 16) <= i.address <= branch.address]
            if any(i.opcode.startswith("HGMMA") for i in body):
                loops.append(body)
    if not loops:
        raise ValueError("no loop holds an HGMMA instruction: not a wgmma mainloop")
    return min(loops, key=len)


def _count(instructions: list[Instruction], *prefixes: str) -> int:
    return sum(i.opcode.startswith(prefixes) for i in instructions)


def _by_opcode(instructions: list[Instruction], *prefixes: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in instructions:
        if i.opcode.startswith(prefixes):
            counts[i.opcode] = counts.get(i.opcode, 0) + 1
    return dict(sorted(counts.items()))


def _wait_depths(loop: list[Instruction]) -> list[int]:
    """How many wgmma groups each ``WARPGROUP.DEPBAR.LE gsb0, N`` leaves in flight."""
    return [
        int(i.operands.rsplit(",", 1)[1], 16) for i in loop if i.opcode == "WARPGROUP.DEPBAR.LE"
    ]


def _register_split(instructions: list[Instruction]) -> dict[str, int]:
    """The warp roles' register counts: setmaxnreg's release (producer) and allocation
    (consumers), as ``DEALLOC``/``TRY_ALLOC`` to registers per thread."""
    return dict(
        sorted(
            (i.opcode.split(".")[1], int(_TARGET.findall(i.operands)[-1], 16))
            for i in instructions
            if i.opcode.startswith("USETMAXREG")
        )
    )


def facts(instructions: list[Instruction]) -> dict[str, object]:
    """The facts of one kernel: mainloop counts per K tile, then whole-kernel facts."""
    loop = mainloop(instructions)
    tma_stores = _count(instructions, "UTMASTG")
    return {
        "mainloop_instructions": len(loop),
        "hgmma_forms": sorted({i.opcode for i in loop if i.opcode.startswith("HGMMA")}),
        "hgmma_per_k_tile": _count(loop, "HGMMA"),
        "hgmma_operand_a_in_registers": all(
            not i.operands.split(",")[1].strip().startswith("gdesc")
            for i in loop
            if i.opcode.startswith("HGMMA")
        ),
        "wgmma_fences_per_k_tile": _count(loop, "WARPGROUP.ARRIVE"),
        "wgmma_wait_depths": _wait_depths(loop),
        "fp8_unpacks_per_k_tile": _count(loop, "F2FP.F16.E5M2.UNPACK_B"),
        "f16_to_f32_per_k_tile": _count(loop, "HADD2.F32"),
        "bf16_packs_per_k_tile": _count(loop, "F2FP.BF16.F32.PACK_AB"),
        "scale_multiplies_per_k_tile": _count(loop, "HMUL2.BF16"),
        "shared_loads_per_k_tile": _by_opcode(loop, "LDS", "LDSM"),
        "global_loads_per_k_tile": _by_opcode(loop, "LDG"),
        "local_memory_per_k_tile": _by_opcode(loop, "LDL", "STL"),
        "runtime_divisions_per_k_tile": _count(loop, "MUFU.RCP"),
        "barrier_waits_per_k_tile": _count(loop, "SYNCS.PHASECHK"),
        "barrier_arrivals_per_k_tile": _count(loop, "SYNCS.ARRIVE"),
        "hgmma_in_kernel": _count(instructions, "HGMMA"),
        "tma_loads": _by_opcode(instructions, "UTMALDG"),
        "tma_multicast_loads": sum("MULTICAST" in i.opcode for i in instructions),
        "tma_descriptor_updates": _count(instructions, "UTMACCTL.IV"),
        "register_split": _register_split(instructions),
        "local_memory_in_kernel": _by_opcode(instructions, "LDL", "STL"),
        "epilogue": (
            "TMA store from shared memory"
            if tma_stores
            else "stores to global memory from registers"
        ),
        "epilogue_stores": _by_opcode(instructions, "UTMASTG", "STSM", "STG"),
    }


@functools.cache
def read(binary: Path, name_contains: str) -> dict[str, object]:
    """``facts`` of the kernel in ``binary`` (a cubin or an executable) whose name contains
    ``name_contains``, disassembled by the pinned cuobjdump."""
    return facts(kernel(toolkit.run([toolkit.tool("cuobjdump"), "-sass", binary]), name_contains))
