"""Masked grouped GEMM on NVFP4 operands for NVIDIA Blackwell (sm_100a), in Pallas
Mosaic GPU: the tensor cores' native block-scaled MMA, no decode.

out[e, m, :] = alpha[e] * deq(A)[e, m, :] @ deq(B)[e]ᵀ for m < masked_m[e], bf16 out;
rows at or past masked_m[e] are never written (an expert with no rows writes nothing).

Per CTA, one [128, block_n] tile of one expert (grid = experts × n blocks × m blocks; a
block wholly past masked_m[e] returns at once). One warpgroup: warp 0 issues the TMA
loads of a ``stages``-deep ring (A and B codes as e2m1, K-major, 128-byte swizzled; their
e4m3 block scales as 512-byte atoms of the reference's 128x4 layout, which is exactly
the shared-memory layout ``tcgen05.cp`` reads); warp 1 copies each step's scales to
tensor memory and issues ``tcgen05.mma.kind::mxf4nvf4.block_scale.scale_vec::4X``
(one e4m3 scale per 16 K, float32 accumulator in tensor memory), each MMA freeing its
slot through a barrier the tensor core arrives on. Then the warpgroup loads the
accumulator from tensor memory, scales by alpha, rounds to bf16 and stores by TMA (the
whole tile, or row by row in an expert's last, partial block).

Operands, as the reference holds them: A codes [E, M, K/2] and B codes [E, N, K/2]
(byte j holds K = 2j in its low nibble), scales in the 128x4 layout,
[E, ceil(M/128), ceil(K/64), 32, 16] bytes (``numerics.swizzle``).

The Mosaic GPU interpreter runs no tcgen05 or tensor-memory operation (jax 0.10.2 and
0.11.2): this kernel is lowered on any host and runs only on a Blackwell GPU.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_lowering
from kernels.moe_nvfp4 import arguments
from kernels.moe_nvfp4.mgpu_gemm import Problem

# sm_100's opt-in dynamic shared memory per block is Hopper's, 227 KiB.
from kernels.moe_nvfp4.mgpu_mainloop import SMEM_LIMIT_BYTES, store_valid_rows

BLOCK_M = 128  # the MMA's M with one CTA: the 128 lanes of tensor memory
SCALE_BLOCK = 16  # NVFP4: one e4m3 scale per 16 K
ATOM_ROWS, ATOM_K = 128, 64  # one 512-byte atom of the 128x4 layout: 128 rows × 4 scales
TMA_WARP, MMA_WARP = 0, 1


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """N tile, K per pipeline step, and the TMA ring's depth."""

    block_n: int = 128
    block_k: int = 256
    stages: int = 3

    def __post_init__(self):
        if self.block_n not in (128, 256):
            raise ValueError(f"{self.block_n=} must be 128 or 256 (whole 128-row scale "
                             "atoms of B; the MMA's N is at most 256)")
        if self.block_k not in (256, 512):
            raise ValueError(f"{self.block_k=} must be 256 or 512 (whole 128-byte "
                             "swizzled rows of e2m1 codes)")
        if not 2 <= self.stages <= 6:
            raise ValueError(f"{self.stages=} must be in [2, 6]")


def check(problem: Problem, config: TuningConfig) -> None:
    """Refuse a problem whose sizes the configuration's tiles do not divide."""
    if problem.k % config.block_k:
        raise ValueError(f"k={problem.k} must be a multiple of block_k={config.block_k}")
    if problem.m % BLOCK_M or problem.n % config.block_n:
        raise ValueError(f"(m, n)=({problem.m}, {problem.n}) must be multiples of "
                         f"({BLOCK_M}, {config.block_n})")


def _codes(shape) -> plgpu.SMEM:
    """e2m1 codes, K-major, 128-byte swizzled (256 codes per swizzled row)."""
    return plgpu.SMEM(shape, jnp.float4_e2m1fn,
                      transforms=(plgpu.TilingTransform((8, 256)), plgpu.SwizzleTransform(128)))


def k_loop_scratch(bn: int, bk: int, stages: int) -> dict:
    """What ``block_scaled_k_loop`` uses, by name: the TMA ring of codes and scale atoms,
    the accumulator [128, bn] and both scale tiles in tensor memory, its barriers."""
    atoms_k = bk // ATOM_K
    return {
        "a_smem": _codes((stages, BLOCK_M, bk)),
        "b_smem": _codes((stages, bn, bk)),
        "sa_smem": plgpu.SMEM((stages, 1, atoms_k, 32, 16), jnp.float8_e4m3fn),
        "sb_smem": plgpu.SMEM((stages, bn // ATOM_ROWS, atoms_k, 32, 16), jnp.float8_e4m3fn),
        "acc_tmem": plgpu.TMEM((BLOCK_M, bn), jnp.float32),
        "sa_tmem": plgpu.TMEM((BLOCK_M, bk // SCALE_BLOCK), jnp.float8_e4m3fn,
                              layout=plgpu.TMEMLayout.SCALES_LAYOUT),
        "sb_tmem": plgpu.TMEM((bn, bk // SCALE_BLOCK), jnp.float8_e4m3fn,
                              layout=plgpu.TMEMLayout.SCALES_LAYOUT),
        "loaded": plgpu.Barrier(num_arrivals=4, num_barriers=stages),
        "consumed": plgpu.Barrier(num_barriers=stages, orders_tensor_core=True),
        "mma_done": plgpu.Barrier(orders_tensor_core=True),
    }


def shared_bytes(scratch: dict) -> int:
    """Shared memory of scratch buffers, e2m1 codes at half a byte each (tensor memory
    is budgeted apart, in columns)."""
    shared = {k: v for k, v in scratch.items() if not k.endswith("_tmem")}
    codes = sum(math.prod(shared.pop(k).shape) // 2 for k in ("a_smem", "b_smem"))
    return codes + mgpu_lowering.scratch_bytes(shared)


def scratch_types(config: TuningConfig) -> dict:
    """The kernel's shared and tensor memory by name."""
    return {**k_loop_scratch(config.block_n, config.block_k, config.stages),
            "o_smem": plgpu.SMEM((BLOCK_M, config.block_n), jnp.bfloat16)}


def smem_bytes(config: TuningConfig) -> int:
    return shared_bytes(scratch_types(config))


def make(problem: Problem, config: TuningConfig):
    """``f(a, a_scales, b, b_scales, alpha, masked_m) -> out [E, M, N] bf16`` (uint8 codes
    and scale bytes in, as the case holds them)."""
    check(problem, config)
    used = smem_bytes(config)
    if used > SMEM_LIMIT_BYTES:
        raise ValueError(f"{config}: {used} bytes of shared memory exceed the "
                         f"{SMEM_LIMIT_BYTES}-byte limit")
    bn, bk, stages = config.block_n, config.block_k, config.stages
    k_steps = problem.k // bk

    def body(a_ref, sa_ref, b_ref, sb_ref, alpha_ref, masked_ref, out_ref, **s):
        e = lax.axis_index("experts")
        m_block, n_block = lax.axis_index("m_blocks"), lax.axis_index("n_blocks")
        m0, n0 = m_block * BLOCK_M, n_block * bn
        rows = masked_ref[e]

        @pl.when(m0 < rows)
        def _():
            block_scaled_k_loop((a_ref, sa_ref, b_ref, sb_ref), s, e, m_block, n_block, bn,
                                bk, stages, k_steps)
            plgpu.barrier_wait(s["mma_done"])
            acc = plgpu.async_load_tmem(s["acc_tmem"])
            plgpu.wait_load_tmem()
            s["o_smem"][...] = (acc * alpha_ref[e]).astype(jnp.bfloat16)
            plgpu.commit_smem()
            store_valid_rows(s["o_smem"], out_ref, e, m0, n0, rows, BLOCK_M, bn)
            plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((problem.experts, problem.m, problem.n), jnp.bfloat16),
        grid=(problem.experts, problem.n // bn, problem.m // BLOCK_M),
        grid_names=("experts", "n_blocks", "m_blocks"),
        scratch_types=scratch_types(config))

    def run(a, a_scales, b, b_scales, alpha, masked_m):
        return call(as_e2m1(a), as_e4m3(a_scales), as_e2m1(b), as_e4m3(b_scales), alpha, masked_m)

    return arguments.checked(run, ("a", "a_scales", "b", "b_scales", "alpha", "masked_m"),
                             arg_shapes(problem), problem.m, {})


def block_scaled_k_loop(operands, s, e, m_block, b_block, bn: int, bk: int, stages: int,
                        k_steps: int, step0: int = 0, before_mma=None) -> None:
    """One K loop of s["acc_tmem"] = A[e, 128-row block m_block] @ B[e, bn-row block
    b_block]ᵀ on the block-scaled NVFP4 MMA: warp 0 fills the ``stages``-deep TMA ring
    (codes and 128x4 scale atoms of A and B), warp 1 copies each step's scales to tensor
    memory and issues the MMA, which frees the slot; s["mma_done"] is arrived on when the
    accumulator is complete. ``step0``: the ring's steps already taken (a kernel running
    several loops keeps one ring); ``before_mma``: what warp 1 waits for first."""
    a_ref, sa_ref, b_ref, sb_ref = operands
    atoms_k, b_atoms = bk // ATOM_K, bn // ATOM_ROWS

    @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
    def _per_warp():
        warp = lax.axis_index("warp")

        @pl.when(warp == TMA_WARP)
        def _load():
            def step(ki, carry):
                slot = lax.rem(step0 + ki, stages)

                @pl.when(step0 + ki >= stages)
                def _():
                    plgpu.barrier_wait(s["consumed"].at[slot])

                k_slice, atoms = pl.ds(ki * bk, bk), pl.ds(ki * atoms_k, atoms_k)
                loaded = s["loaded"].at[slot]
                plgpu.copy_gmem_to_smem(a_ref.at[e, pl.ds(m_block * BLOCK_M, BLOCK_M), k_slice],
                                        s["a_smem"].at[slot], loaded)
                plgpu.copy_gmem_to_smem(b_ref.at[e, pl.ds(b_block * bn, bn), k_slice],
                                        s["b_smem"].at[slot], loaded)
                plgpu.copy_gmem_to_smem(sa_ref.at[e, pl.ds(m_block, 1), atoms],
                                        s["sa_smem"].at[slot], loaded)
                plgpu.copy_gmem_to_smem(sb_ref.at[e, pl.ds(b_block * b_atoms, b_atoms), atoms],
                                        s["sb_smem"].at[slot], loaded)
                return carry

            lax.fori_loop(0, k_steps, step, None)

        @pl.when(warp == MMA_WARP)
        def _multiply():
            if before_mma is not None:
                before_mma()

            def step(ki, carry):
                slot = lax.rem(step0 + ki, stages)
                plgpu.barrier_wait(s["loaded"].at[slot])
                plgpu.async_copy_scales_to_tmem(s["sa_smem"].at[slot], s["sa_tmem"])
                plgpu.async_copy_scales_to_tmem(s["sb_smem"].at[slot], s["sb_tmem"])
                plgpu.tcgen05_mma(s["acc_tmem"], s["a_smem"].at[slot],
                                  s["b_smem"].at[slot].transpose((1, 0)),
                                  s["consumed"].at[slot], a_scale=s["sa_tmem"],
                                  b_scale=s["sb_tmem"], accumulate=ki > 0)
                return carry

            lax.fori_loop(0, k_steps, step, None)
            plgpu.tcgen05_commit_arrive(s["mma_done"])


def as_e2m1(packed):
    """uint8 [..., K/2] -> e2m1 [..., K] (low nibble first, as the reference packs)."""
    codes = lax.bitcast_convert_type(packed, jnp.float4_e2m1fn)
    return codes.reshape(*packed.shape[:-1], -1)


def as_e4m3(scale_bytes):
    return lax.bitcast_convert_type(scale_bytes, jnp.float8_e4m3fn)


def scale_atoms(rows: int, k: int) -> tuple[int, int]:
    """The 128x4 layout's atoms: (row blocks, K blocks of 64)."""
    return math.ceil(rows / ATOM_ROWS), math.ceil(k / ATOM_K)


def arg_shapes(problem: Problem) -> tuple[jax.ShapeDtypeStruct, ...]:
    e, m, n, k = problem.experts, problem.m, problem.n, problem.k
    u8 = jnp.uint8
    return (jax.ShapeDtypeStruct((e, m, k // 2), u8),
            jax.ShapeDtypeStruct((e, *scale_atoms(m, k), 32, 16), u8),
            jax.ShapeDtypeStruct((e, n, k // 2), u8),
            jax.ShapeDtypeStruct((e, *scale_atoms(n, k), 32, 16), u8),
            jax.ShapeDtypeStruct((e,), jnp.float32), jax.ShapeDtypeStruct((e,), jnp.int32))

