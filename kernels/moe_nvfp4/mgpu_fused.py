"""GEMM1 + SiLU·mul + NVFP4 requantize in one Pallas Mosaic GPU kernel (Hopper).

For expert e and rows m < masked_m[e]: h = alpha1[e] * deq(A1) @ deq(W1)ᵀ over 2N
columns (gate, then up), act = SiLU(gate) * up, then act is quantized with a2_gs[e]
exactly as the grouped quantize does. The [E, M, 2N] intermediate lives only in
registers: a CTA's four float32 accumulators hold gate and up, even and odd act columns
apart (W1 prepacked in ``layouts.gate_up_order``), so the epilogue packs two codes per
byte elementwise. One CTA per (expert, 256 act columns, row block) runs two passes of
128 act columns (``mgpu_mainloop.k_loop``, four 64-column B chunks each) so its 16
scale bytes per row fill one 16-byte TMA row. Outputs: a2 packed [E, M, N/2] and
row-major scales [E, M, N/16] (GEMM2's A operand); rows at or past masked_m untouched.

Constraints: K a multiple of 256; N of 256; M of block_m. Four 64-wide accumulators
(128 registers per thread at block_m 64) keep block_m at 64 for register room.
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
from kernels.moe_nvfp4.mgpu_quantize import GIVEN_SCALE, merge_scale_bytes, quantize_pair

ACT_BLOCK = 256  # act columns per CTA: two passes of 128 (16 scale bytes per row)


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    """Rows per CTA, TMA ring depth; ``produce_scales`` off (an ablation): the requantize
    gives every block ``GIVEN_SCALE`` instead of producing its scale."""

    block_m: int = 64
    stages: int = 2
    produce_scales: bool = True

    def __post_init__(self):
        if self.block_m != 64:
            raise ValueError(f"{self.block_m=} must be 64 (four accumulators per thread)")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"{self.stages=} must be in [1, 4]")


def scratch_types(config: FusedConfig) -> dict:
    bm = config.block_m
    return {**loop.scratch_types(bm, 4, config.stages),
            "q_smem": plgpu.SMEM((bm, 64), jnp.uint8),
            "s_smem": plgpu.SMEM((bm, 16), jnp.uint8),
            "q_rows": loop.row_staging(bm, 64, jnp.uint8),
            "s_rows": loop.row_staging(bm, 16, jnp.uint8)}


def smem_bytes(config: FusedConfig) -> int:
    return loop.budget_bytes(scratch_types(config))


def silu_mul(gate, up):
    return gate / (1.0 + jnp.exp(-gate)) * up


def make(experts: int, m: int, n: int, k: int, config: FusedConfig, interpret: Any = None):
    """``f(a1, a1_scales, w1_fused, w1_scales_fused, alpha1, a2_gs, masked_m) ->
    (a2_packed [E, M, N/2], a2_scales [E, M, N/16])``."""
    bm, stages = config.block_m, config.stages
    if k % loop.K_STEP or n % ACT_BLOCK or m % bm:
        raise ValueError(f"(m, n, k)=({m}, {n}, {k}) must be multiples of "
                         f"({bm}, {ACT_BLOCK}, {loop.K_STEP})")
    loop.check_budget(str(config), scratch_types(config))
    if interpret is not None:
        mgpu_interpret.prepare_host_interpreter()

    def body(a_ref, sa_ref, w_ref, sw_ref, alpha_ref, gs_ref, masked_ref, q_ref, s_ref,
             **smem):
        e = lax.axis_index("experts")
        block = lax.axis_index("act_blocks")
        m0 = lax.axis_index("m_blocks") * bm
        rows = masked_ref[e]
        loop.clear_b_scales(smem, stages, 4)

        @pl.when(m0 < rows)
        def _():
            for half in range(2):
                first = (2 * block + half) * 4 * 64  # this pass's 256 W1 columns

                def compute(*accs, first=first):
                    def mma(nibble):
                        for c, acc in enumerate(accs):
                            plgpu.wgmma(acc, smem["a_bf16"].at[nibble],
                                        smem["b_bf16"].at[nibble, :, pl.ds(c * 64, 64)])

                    loop.k_loop((a_ref, sa_ref, w_ref, sw_ref), smem, e, m0,
                                lambda c: first + c * 64, block_m=bm, chunks=4,
                                stages=stages, k_steps=k // loop.K_STEP, mma=mma)
                    return [acc[...] for acc in accs]

                gate_even, gate_odd, up_even, up_odd = pl.run_scoped(
                    compute, *[plgpu.ACC((bm, 64), jnp.float32)] * 4)
                alpha = alpha_ref[e]
                packed, scale_bytes = quantize_pair(
                    silu_mul(gate_even * alpha, up_even * alpha),
                    silu_mul(gate_odd * alpha, up_odd * alpha), gs_ref[e],
                    given_scale=None if config.produce_scales else GIVEN_SCALE)
                smem["q_smem"][...] = packed.astype(jnp.uint8)
                merge_scale_bytes(smem["s_smem"], scale_bytes, half)
                plgpu.commit_smem()
                column = (2 * block + half) * 64  # packed bytes: 128 act columns
                loop.store_valid_rows(smem["q_smem"], q_ref, e, m0, column, rows, bm, 64,
                                      smem["q_rows"])
                plgpu.wait_smem_to_gmem(0)  # q_smem is rewritten by the next pass
            loop.store_valid_rows(smem["s_smem"], s_ref, e, m0, block * 16, rows, bm, 16,
                                  smem["s_rows"])
            plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((experts, m, n // 2), jnp.uint8),
                  jax.ShapeDtypeStruct((experts, m, n // 16), jnp.uint8)),
        grid=(experts, n // ACT_BLOCK, m // bm), grid_names=("experts", "act_blocks", "m_blocks"),
        scratch_types=scratch_types(config), interpret=interpret)
    return arguments.checked(call, ("a1", "a1_scales", "w1_fused", "w1_scales_fused", "alpha1",
                                    "a2_gs", "masked_m"), arg_shapes(experts, m, n, k), m,
                             {"a1_scales": arguments.ROW_MAJOR})


def arg_shapes(experts: int, m: int, n: int, k: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    u8, f32 = jnp.uint8, jnp.float32
    return (jax.ShapeDtypeStruct((experts, m, k // 2), u8),
            jax.ShapeDtypeStruct((experts, m, k // 16), u8),
            jax.ShapeDtypeStruct((experts, k // 2, 2 * n), u8),
            jax.ShapeDtypeStruct((experts, k // 16, 2 * n), u8),
            jax.ShapeDtypeStruct((experts,), f32), jax.ShapeDtypeStruct((experts,), f32),
            jax.ShapeDtypeStruct((experts,), jnp.int32))
