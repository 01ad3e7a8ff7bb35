"""Case 03's port on a CPU host: its host-side CuTe DSL logic (schedule, MMA layouts) run by
@cute.jit in a child process, and its ahead-of-time compile for sm_90a."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels.grouped_gemm_fp8_bf16 import compile_port, port, sass, schedule
from kernels.grouped_gemm_fp8_bf16.problems import GroupedProblem, ProblemError

pytestmark = [pytest.mark.compile, pytest.mark.timeout(300)]


def host_check(*args: str):
    """Run host_checks.py (beside this file) in a child (GPU intrinsics abort a process)."""
    done = subprocess.run([sys.executable, "-m", "tests.grouped_gemm_fp8_bf16.host_checks", *args],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "CUTE_DSL_ARCH": "sm_90a",
                               "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_schedule_in_numpy_walks_every_tile_once_group_after_group():
    m, n = (16, 0, 40, 1024, 3), 2048
    table = schedule.table(m, n)
    n_tiles = n // schedule.TILE_N
    expected = [(g, nt, mt) for g, rows in enumerate(m)
                for mt in range(schedule.ceil_div(rows, schedule.TILE_M))
                for nt in range(n_tiles)]
    assert table.tolist() == [list(t) for t in expected]


def test_the_kernels_schedule_matches_numpy_on_the_host():
    m, n = (16, 0, 40, 1024, 3, 0), 2000  # empty groups, M and N off the tile grid
    got = host_check("schedule", ",".join(map(str, m)), str(n))
    assert got == schedule.table(m, n).tolist()


def test_mma_fragments_cover_the_cta_tile_exactly_once():
    """Each (n, k) of the 128 × 64 converted-B tile sits in exactly one consumer thread's
    register fragment, and each (n, m) of the 128 × 16 accumulator tile likewise: the
    coordinates the kernel uses for scales and the epilogue."""
    got = host_check("layout")
    tile_n, tile_m, tile_k = port.TILE
    for name, shape in (("b", (tile_n, tile_k)), ("acc", (tile_n, tile_m))):
        coords = np.array(got[name]).reshape(-1, 2)
        hits = np.zeros(shape, int)
        np.add.at(hits, (coords[:, 0], coords[:, 1]), 1)
        assert (hits == 1).all(), name
    # Warpgroup 0 holds rows 0..63 of N, warpgroup 1 rows 64..127 (two along N), of B
    # and of the accumulators (the epilogue stages each warpgroup's half of D apart).
    for name in ("b", "acc"):
        rows = np.array(got[name])[..., 0]
        assert rows[:128].max() == 63 and rows[128:].min() == 64, name


def test_the_epilogue_stores_each_accumulator_at_its_own_coordinates():
    """The epilogue's stmatrix copy takes every f16 accumulator value once and stores it
    at the (n, m) the MMA computed it for."""
    acc = np.array(host_check("layout")["acc"])
    stores = np.array(host_check("d_store"))
    for thread in range(acc.shape[0]):
        index, coords = stores[thread, :, 0], stores[thread, :, 1:]
        assert sorted(index) == list(range(acc.shape[1]))
        assert (acc[thread, index] == coords).all(), thread


@pytest.mark.parametrize(("scale_only", "example_stages"), [(False, 21), (True, 19)])
def test_the_ring_is_as_deep_as_example_69s(scale_only, example_stages):
    """Example 69's builder rule: stages of (tiles, and in ScaleOnly a row of bf16 scales,
    rounded up to 1024 B) + 16 B of barriers fill the 232,448 B less the kernel's carve-out
    (4 tensor maps and an 8-stage scheduler pipeline, 640 B), rounded down to 1024 B, less
    the epilogue's shared storage (10,240 B, the sizeof of the example's type by nvcc
    13.0); one more would not fit: 19 (21) stages, as test_grouped_gemm_reference.py
    reads them from the example's build."""
    assert port.example_kernel_carveout() == 640
    assert port.example_epilogue_storage() == 10_240
    stages = port.GroupedMixedGemm(scale_only).stages
    tile_n, tile_m, tile_k = port.TILE
    tiles = tile_n * tile_k + 2 * tile_m * tile_k + scale_only * 2 * tile_n
    stage = -(-tiles // 1024) * 1024 + 16
    capacity = (schedule.SMEM_LIMIT_BYTES - 640) // 1024 * 1024 - 10_240
    assert stages * stage <= capacity < (stages + 1) * stage
    assert stages == example_stages


def test_the_conversion_is_handed_each_fp8_byte_of_its_fragment():
    """The kernel's read of a ring stage (``port.fp8_pairs``, ``port.fp8_block``: 2-byte
    loads, two per 32-bit word, read back as fp8), run on the CPU over a stage in host
    memory holding every fp8 code 32 times, hands the conversion, in fragment order, the
    byte at each fragment element's (n, k) under the ring's 64-byte swizzle (S<2,4,3>:
    bits 7-8 of the byte offset into bits 4-5), for all 256 codes. The conversion after
    it is the DSL's, as before; CuTe DSL cannot lower it for the CPU."""
    got = host_check("fp8_fragment")
    stage, taken = np.array(got["stage"]), np.array(got["taken"])
    coords = np.array(host_check("layout")["b"])
    offset = coords[..., 0] * port.TILE[2] + coords[..., 1]
    assert (taken == stage[offset ^ ((offset & 0x180) >> 3)]).all()
    assert (taken != stage[offset]).any()  # the swizzle matters: unswizzled reads differ
    assert len(np.unique(taken)) == 256


@pytest.mark.parametrize(("changes", "message"), [
    ({"k": 528}, "k=528 must be a multiple of 64"),
    ({"chunk": 96}, "chunk=96 must be a multiple of 64"),
])
def test_the_port_rejects_what_it_cannot_tile(changes, message):
    fields = {"m": (16,), "n": 256, "k": 512, "chunk": 128, "mode": "scale_only", **changes}
    with pytest.raises(ProblemError, match=message):
        schedule.check(GroupedProblem(**fields))


@pytest.mark.parametrize("mode", ["convert_only", "scale_only"])
def test_the_port_compiles_for_sm90a_with_wgmma_from_registers(mode, tmp_path):
    facts = compile_port.build(mode, str(tmp_path))
    assert facts["cubin"].endswith(".sm_90a.cubin")
    assert 0 < facts["dynamic_smem_bytes"] <= schedule.SMEM_LIMIT_BYTES
    assert facts["threads"] == port.THREADS
    assert facts["stages"] == port.GroupedMixedGemm(mode == "scale_only").stages
    assert 0 < facts["registers_per_thread"] <= 255 and facts["local_bytes"] == 0
    # wgmma m64n16k16, bf16 inputs, fp32 accumulate: the mixed-input RS form (A registers).
    assert set(facts["sass_mma"]) == {"HGMMA.64x16x16.F32.BF16"}
    listing = compile_port.toolkit.run([compile_port.toolkit.tool("cuobjdump"), "-sass",
                                        facts["cubin"]])
    mma = next(line for line in listing.splitlines() if "HGMMA" in line)
    assert "gdesc[" in mma and mma.split("HGMMA.64x16x16.F32.BF16")[1].split(",")[1].strip(
    ).startswith("R")  # A from a register, B from a shared-memory descriptor
    assert "F2FP.F16.E5M2.UNPACK_B" in listing  # the fp8 conversion
    assert ("HMUL2.BF16" in listing) == (mode == "scale_only")  # the bf16 scale multiply
    # Its mainloop read by the rules that read example 69's: per K tile of 128 × 64 fp8
    # over 256 consumer threads, 16 pairs converted (and scaled) and 4 wgmma k16 steps.
    mainloop = sass.read(Path(facts["cubin"]), compile_port.KERNEL_NAME)
    assert mainloop["hgmma_per_k_tile"] == 4 and mainloop["fp8_unpacks_per_k_tile"] == 16
    assert mainloop["scale_multiplies_per_k_tile"] == (16 if mode == "scale_only" else 0)
    if mode == "scale_only":  # the SASS that test_grouped_gemm_sass.py reads is this
        fixture = Path(__file__).parents[1] / "data" / "grouped_gemm_sass" / "port_scale_only.sass"
        assert mainloop == sass.facts(sass.kernel(fixture.read_text(), compile_port.KERNEL_NAME))
