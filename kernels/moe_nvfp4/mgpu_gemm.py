"""Masked grouped GEMM on packed NVFP4 operands for NVIDIA Hopper, in Pallas Mosaic GPU.

out[e, m, :] = alpha[e] * deq(A)[e, m, :] @ deq(B)[e]ᵀ for m < masked_m[e], bf16 out.
Rows at or past masked_m[e] are never written (an expert with no rows writes nothing).

One warpgroup per CTA runs ``mgpu_mainloop.k_loop`` over a [block_m, block_n] tile into
one float32 accumulator, then scales by alpha, rounds to bf16 and stores by TMA (whole
tile, or row by row for an expert's last, partial block). Scheduling: one tile per CTA
(grid = experts × n blocks × m blocks, idle CTAs for masked blocks), or persistent
(``ctas`` CTAs walk the tile list round-robin, as the reference's persistent kernel
does, so skipped tiles cost no launch).

Constraints: K a multiple of 256; M of block_m; N of block_n.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import mgpu_interpret
from kernels.moe_nvfp4 import arguments
from kernels.moe_nvfp4 import mgpu_mainloop as loop


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Tile, TMA ring depth, and scheduling (0 CTAs: one tile per CTA; else persistent)."""

    block_m: int = 64
    block_n: int = 64
    stages: int = 2
    persistent_ctas: int = 0

    def __post_init__(self):
        if self.block_m not in (64, 128):
            raise ValueError(f"{self.block_m=} must be 64 or 128 (one warpgroup's rows)")
        if self.block_n % 64 or not 64 <= self.block_n <= 256:
            raise ValueError(f"{self.block_n=} must be a multiple of 64 in [64, 256]")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")
        if self.persistent_ctas < 0:
            raise ValueError(f"{self.persistent_ctas=} must be >= 0")


@dataclasses.dataclass(frozen=True)
class Problem:
    """Experts, rows per expert (capacity), output columns, reduction length."""

    experts: int
    m: int
    n: int
    k: int

    def check(self, config: TuningConfig) -> None:
        if self.k % loop.K_STEP:
            raise ValueError(f"k={self.k} must be a multiple of {loop.K_STEP}")
        if self.m % config.block_m or self.n % config.block_n:
            raise ValueError(f"(m, n)=({self.m}, {self.n}) must be multiples of "
                             f"(block_m, block_n)=({config.block_m}, {config.block_n})")


def scratch_types(config: TuningConfig) -> dict:
    """The kernel's shared memory by name (also what the budget counts)."""
    return {**loop.scratch_types(config.block_m, config.block_n // 64, config.stages),
            "o_smem": plgpu.SMEM((config.block_m, config.block_n), jnp.bfloat16)}


def smem_bytes(config: TuningConfig) -> int:
    return loop.budget_bytes(scratch_types(config))


def make(problem: Problem, config: TuningConfig, interpret: Any = None):
    """``f(a, a_scales, b_t, b_scales_t, alpha, masked_m) -> out [E, M, N] bf16``."""
    problem.check(config)
    loop.check_budget(str(config), scratch_types(config))
    bm, bn, stages = config.block_m, config.block_n, config.stages
    chunks = bn // 64
    m_blocks, n_blocks = problem.m // bm, problem.n // bn
    tiles = problem.experts * n_blocks * m_blocks
    if interpret is not None:
        mgpu_interpret.prepare_host_interpreter()

    def tile(refs, smem, alpha_ref, masked_ref, out_ref, e, n_block, m_block):
        m0, n0 = m_block * bm, n_block * bn
        rows = masked_ref[e]

        @pl.when(m0 < rows)
        def _():
            def compute(acc):
                def mma(nibble):
                    plgpu.wgmma(acc, smem["a_bf16"].at[nibble], smem["b_bf16"].at[nibble])

                loop.k_loop(refs, smem, e, m0, lambda c: n0 + c * 64, block_m=bm,
                            chunks=chunks, stages=stages, k_steps=problem.k // loop.K_STEP,
                            mma=mma)
                return acc[...]

            result = pl.run_scoped(compute, plgpu.ACC((bm, bn), jnp.float32))
            smem["o_smem"][...] = (result * alpha_ref[e]).astype(jnp.bfloat16)
            plgpu.commit_smem()
            loop.store_valid_rows(smem["o_smem"], out_ref, e, m0, n0, rows, bm, bn)
            plgpu.wait_smem_to_gmem(0)  # o_smem is rewritten by the next tile

    def body(a_ref, sa_ref, b_ref, sb_ref, alpha_ref, masked_ref, out_ref, **smem):
        refs = (a_ref, sa_ref, b_ref, sb_ref)
        loop.clear_b_scales(smem, stages, chunks)
        if not config.persistent_ctas:
            tile(refs, smem, alpha_ref, masked_ref, out_ref, lax.axis_index("experts"),
                 lax.axis_index("n_blocks"), lax.axis_index("m_blocks"))
            return
        cta = lax.axis_index("ctas")

        def walk(i, carry):  # tile index -> (expert, n block, m block), m fastest
            index = cta + i * config.persistent_ctas
            tile(refs, smem, alpha_ref, masked_ref, out_ref, index // (n_blocks * m_blocks),
                 (index // m_blocks) % n_blocks, index % m_blocks)
            return carry

        lax.fori_loop(0, (tiles - cta + config.persistent_ctas - 1) // config.persistent_ctas,
                      walk, 0)

    if config.persistent_ctas:
        grid, names = (config.persistent_ctas,), ("ctas",)
    else:
        grid, names = (problem.experts, n_blocks, m_blocks), ("experts", "n_blocks", "m_blocks")
    call = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((problem.experts, problem.m, problem.n), jnp.bfloat16),
        grid=grid, grid_names=names, scratch_types=scratch_types(config), interpret=interpret)
    return arguments.checked(call, ("a", "a_scales", "b_t", "b_scales_t", "alpha", "masked_m"),
                             arg_shapes(problem), problem.m,
                             {"a_scales": arguments.ROW_MAJOR})


def arg_shapes(problem: Problem) -> tuple[jax.ShapeDtypeStruct, ...]:
    e, m, n, k = problem.experts, problem.m, problem.n, problem.k
    u8 = jnp.uint8
    return (jax.ShapeDtypeStruct((e, m, k // 2), u8), jax.ShapeDtypeStruct((e, m, k // 16), u8),
            jax.ShapeDtypeStruct((e, k // 2, n), u8), jax.ShapeDtypeStruct((e, k // 16, n), u8),
            jax.ShapeDtypeStruct((e,), jnp.float32), jax.ShapeDtypeStruct((e,), jnp.int32))
