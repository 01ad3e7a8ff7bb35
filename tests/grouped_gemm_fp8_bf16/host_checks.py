"""The port's host-side CuTe DSL logic, run on the CPU by @cute.jit (no launch).

Run as ``python -m tests.grouped_gemm_fp8_bf16.host_checks CHECK`` in a child process (a
GPU intrinsic reached on the host aborts the whole process); prints JSON on stdout:

- ``schedule M,M,... N``: every tile's (group, n tile, m tile) from ``port.locate_tile``;
- ``layout``: the (n, k) coordinates of each consumer thread's converted-B fragment and
  the (n, m) coordinates of its accumulators, from the port's tiled MMA;
- ``d_store``: for each consumer thread, in the order its epilogue's stmatrix copy takes
  them, the index of each f16 accumulator value and the (n, m) it is stored to;
- ``fp8_fragment``: for each consumer thread, the bytes of one ring stage (host memory,
  the ring's swizzle) that the kernel's pairs-and-words read (``port.fp8_pairs``,
  ``port.load_fp8_pairs``, ``port.fp8_block``) hands to the conversion, in fragment
  order, and the stage.
"""

from __future__ import annotations

import json
import sys

import cutlass
import cutlass.cute as cute
import numpy as np
from cutlass.cute.runtime import from_dlpack

from kernels.grouped_gemm_fp8_bf16 import port, schedule

CONSUMER_THREADS = 256


@cute.jit
def tile_table(offsets: cute.Tensor, out: cute.Tensor, groups: cutlass.Int32,
               n_tiles: cutlass.Int32):
    for tile in range(offsets[groups]):
        group, n_tile, m_tile = port.locate_tile(tile, offsets, groups, n_tiles)
        out[(tile, 0)] = group
        out[(tile, 1)] = n_tile
        out[(tile, 2)] = m_tile


@cute.jit
def fragment_coordinates(b_out: cute.Tensor, acc_out: cute.Tensor):
    tiled_mma = port.GroupedMixedGemm(scale_only=True).make_tiled_mma()
    tile_n, tile_m, tile_k = port.TILE
    for thread in range(cutlass.Int32(CONSUMER_THREADS)):
        slice_ = tiled_mma.get_slice(thread)
        b = slice_.partition_A(cute.make_identity_tensor((tile_n, tile_k)))
        acc = slice_.partition_C(cute.make_identity_tensor((tile_n, tile_m)))
        for i in cutlass.range_constexpr(cute.size(b)):
            b_out[(thread, i, 0)] = b[i][0]
            b_out[(thread, i, 1)] = b[i][1]
        for i in cutlass.range_constexpr(cute.size(acc)):
            acc_out[(thread, i, 0)] = acc[i][0]
            acc_out[(thread, i, 1)] = acc[i][1]


@cute.jit
def d_store_sources(out: cute.Tensor):
    gemm = port.GroupedMixedGemm(scale_only=True)
    tiled_mma = gemm.make_tiled_mma()
    d_store = gemm.make_d_store(tiled_mma)
    tile_n, tile_m, _ = port.TILE
    for thread in range(cutlass.Int32(CONSUMER_THREADS)):
        acc = tiled_mma.get_slice(thread).partition_C(
            cute.make_identity_tensor((tile_n, tile_m)))
        index = cute.make_rmem_tensor(acc.shape, cutlass.Int32)
        for i in cutlass.range_constexpr(cute.size(index)):
            index[i] = i
        taken = d_store.get_slice(thread).retile(index)
        stored = d_store.get_slice(thread).partition_S(
            cute.make_identity_tensor((tile_n, tile_m)))
        for j in cutlass.range_constexpr(cute.size(taken)):
            out[(thread, j, 0)] = taken[j]
            out[(thread, j, 1)] = stored[j][0]
            out[(thread, j, 2)] = stored[j][1]


@cute.jit
def fp8_fragments(stage: cute.Tensor, out: cute.Tensor):
    gemm = port.GroupedMixedGemm(scale_only=True)
    tiled_mma = gemm.make_tiled_mma()
    tile_n, _, tile_k = port.TILE
    # The ring's layout, all its stages; only stage 0 is in memory and read.
    ring = gemm._staged_layout(cutlass.Float8E5M2, tile_n, tile_k)
    s_b = cute.make_tensor(cute.recast_ptr(stage.iterator, ring.inner,
                                           dtype=cutlass.Float8E5M2), ring.outer)
    for thread in range(cutlass.Int32(CONSUMER_THREADS)):
        t_sb = tiled_mma.get_slice(thread).partition_A(s_b)
        blocks = port.fp8_pairs(t_sb, ring.inner)
        halves = port.fp8_halves(blocks)
        port.load_fp8_pairs(blocks, halves, 0)
        words = cute.make_rmem_tensor((cute.size(halves) // 2,), cutlass.Uint32)
        narrow = cute.make_rmem_tensor(t_sb[(None, None, None, 0)].shape, cutlass.Float8E5M2)
        for kb in cutlass.range_constexpr(cute.size(t_sb, mode=[2])):
            narrow[(None, None, kb)].store(
                port.fp8_block(halves, words, kb, narrow[(None, None, kb)].shape))
        taken = cute.recast_tensor(narrow, cutlass.Uint8)
        for i in cutlass.range_constexpr(cute.size(taken)):
            out[(thread, i)] = taken[i]


def main(check: str, *args: str) -> object:
    if check == "schedule":
        m, n = tuple(int(x) for x in args[0].split(",")), int(args[1])
        offsets = schedule.tile_offsets(m, n)
        out = np.full((int(offsets[-1]), 3), -1, np.int32)
        tile_table(from_dlpack(offsets), from_dlpack(out), len(m),
                   schedule.ceil_div(n, schedule.TILE_N))
        return out.tolist()
    tile_n, tile_m, tile_k = port.TILE
    if check == "d_store":
        out = np.full((CONSUMER_THREADS, tile_n * tile_m // CONSUMER_THREADS, 3), -1, np.int32)
        d_store_sources(from_dlpack(out))
        return out.tolist()
    if check == "fp8_fragment":
        # Every fp8 code, 32 times, in an order that is not the tile's.
        # The swizzle acts on addresses, so the stage sits at a 1024-byte boundary.
        codes = np.random.default_rng(0).permutation(np.arange(tile_n * tile_k) % 256)
        memory = np.zeros(codes.size + port.SMEM_ALIGNMENT, np.uint8)
        start = -memory.ctypes.data % port.SMEM_ALIGNMENT
        stage = memory[start:start + codes.size]
        stage[:] = codes
        out = np.zeros((CONSUMER_THREADS, tile_n * tile_k // CONSUMER_THREADS), np.int32)
        fp8_fragments(from_dlpack(stage, assumed_align=port.SMEM_ALIGNMENT), from_dlpack(out))
        return {"stage": stage.tolist(), "taken": out.tolist()}
    b = np.full((CONSUMER_THREADS, tile_n * tile_k // CONSUMER_THREADS, 2), -1, np.int32)
    acc = np.full((CONSUMER_THREADS, tile_n * tile_m // CONSUMER_THREADS, 2), -1, np.int32)
    fragment_coordinates(from_dlpack(b), from_dlpack(acc))
    return {"b": b.tolist(), "acc": acc.tolist()}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
