"""GEMM1 + SiLU·mul + NVFP4 requantize in one kernel for NVIDIA Blackwell (sm_100a), in
Pallas Mosaic GPU: the block-scaled NVFP4 MMA into tensor memory, the epilogue reading
gate and up back from it.

For expert e and rows m < masked_m[e]: h = alpha1[e] * deq(A1) @ deq(W1)ᵀ over 2N
columns (gate, then up), act = SiLU(gate) * up, quantized with a2_gs[e] exactly as the
grouped quantize does. The [E, M, 2N] intermediate never leaves the SM: it lives in
tensor memory. One CTA per (expert, 256 act columns, 128-row block) runs two passes of
128 act columns. A pass is one ``tcgen05.mma.kind::mxf4nvf4`` K loop, as in
``mgpu_gemm_sm100`` (warp 0 issues the TMA ring, warp 1 the MMAs), over 256 rows of W1
prepacked in ``layouts.gate_up_order`` (per 128 act columns: gate's even, gate's odd,
up's even, up's odd), so its [128, 256] float32 accumulator (256 of the 512 columns,
the scale tiles beside it) holds SiLU·mul's even and odd inputs in four quarters. The
warpgroup reads them 16 columns at a time (a row per thread), applies alpha, SiLU·mul
and the quantize (``quantize_pair``), and writes two codes per byte; the next pass's MMA
waits until every thread has read the accumulator (a barrier the warpgroup arrives on).
The CTA's 16 scale bytes per row go out as four 512-byte atoms of the 128x4 layout
(``store_atoms``, as the quantize kernel), which is what GEMM2's block-scaled MMA reads.

Outputs: a2 packed [E, M, N/2] (rows at or past masked_m untouched) and a2 scales in the
128x4 layout [E, M/128 · N/64 · 512] (whole 128-row atoms written).

The Mosaic GPU interpreter runs no tcgen05 or tensor-memory operation (jax 0.10.2 and
0.11.2): this kernel is lowered on any host and runs only on a Blackwell GPU.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels.moe_nvfp4 import arguments
from kernels.moe_nvfp4.mgpu_fused import silu_mul
from kernels.moe_nvfp4.mgpu_gemm_sm100 import (
    ATOM_K,
    BLOCK_M,
    SCALE_BLOCK,
    as_e2m1,
    as_e4m3,
    block_scaled_k_loop,
    k_loop_scratch,
    scale_atoms,
    shared_bytes,
)
from kernels.moe_nvfp4.mgpu_mainloop import (
    REDUCTION_SCRATCH_BYTES,
    SMEM_LIMIT_BYTES,
    store_valid_rows,
)
from kernels.moe_nvfp4.mgpu_quantize import quantize_pair, scale_tile, store_atoms

ACT_BLOCK = 256  # act columns per CTA: 16 scale bytes per row, four 128x4 atoms
PASS = 128  # act columns per pass: 256 W1 rows, the MMA's N
CHUNK = 16  # accumulator columns per epilogue read: even and odd of 32 act columns
LAYOUT = plgpu.Layout.TCGEN05  # the accumulator in registers: a row per thread


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    """K per pipeline step and the TMA ring's depth (the tile is 128 rows × 128 act
    columns per pass, fixed by the 128x4 atoms and the MMA's N of 256)."""

    block_k: int = 256
    stages: int = 3

    def __post_init__(self):
        if self.block_k not in (256, 512):
            raise ValueError(f"{self.block_k=} must be 256 or 512 (whole 128-byte "
                             "swizzled rows of e2m1 codes)")
        if not 2 <= self.stages <= 6:
            raise ValueError(f"{self.stages=} must be in [2, 6]")


def scratch_types(config: FusedConfig) -> dict:
    """The kernel's shared and tensor memory by name."""
    return {**k_loop_scratch(2 * PASS, config.block_k, config.stages),
            "q_smem": plgpu.SMEM((BLOCK_M, ACT_BLOCK // 2), jnp.uint8),
            "s_smem": plgpu.SMEM((BLOCK_M, ACT_BLOCK // SCALE_BLOCK), jnp.uint8),
            "atoms_smem": plgpu.SMEM((4, 32, 16), jnp.uint8),
            "acc_read": plgpu.Barrier(orders_tensor_core=True)}


def smem_bytes(config: FusedConfig) -> int:
    """Its buffers and the scratch Pallas adds for the quantize's reductions."""
    return shared_bytes(scratch_types(config)) + REDUCTION_SCRATCH_BYTES


def check(experts: int, m: int, n: int, k: int, config: FusedConfig) -> None:
    """Refuse sizes the tiles do not divide, or a configuration over the shared-memory
    budget, naming it."""
    if k % config.block_k or n % ACT_BLOCK or m % BLOCK_M or experts < 1:
        raise ValueError(f"(experts, m, n, k)=({experts}, {m}, {n}, {k}): experts >= 1, "
                         f"m, n, k multiples of ({BLOCK_M}, {ACT_BLOCK}, {config.block_k})")
    used = smem_bytes(config)
    if used > SMEM_LIMIT_BYTES:
        raise ValueError(f"{config}: {used} bytes of shared memory exceed the "
                         f"{SMEM_LIMIT_BYTES}-byte limit")


def make(experts: int, m: int, n: int, k: int, config: FusedConfig):
    """``f(a1, a1_scales, w1, w1_scales, alpha1, a2_gs, masked_m) -> (a2_packed
    [E, M, N/2], a2_scales flat in the 128x4 layout)``: uint8 codes and scale bytes in,
    A1's scales as 128x4 atoms, W1 as ``layouts.fused_w1_sm100`` prepacks it."""
    check(experts, m, n, k, config)
    bk, stages, k_steps = config.block_k, config.stages, k // config.block_k

    def body(a_ref, sa_ref, w_ref, sw_ref, alpha_ref, gs_ref, masked_ref, q_ref, s_ref,
             **s):
        e, block = lax.axis_index("experts"), lax.axis_index("act_blocks")
        m_block = lax.axis_index("m_blocks")
        m0, rows = m_block * BLOCK_M, masked_ref[e]

        def read_quarters(c):
            """Chunk c of the accumulator's four quarters, from tensor memory."""
            loads = [plgpu.async_load_tmem(s["acc_tmem"].at[:, pl.ds(column, CHUNK)],
                                           layout=LAYOUT) for column in quarter_columns(c)]
            plgpu.wait_load_tmem()
            return loads

        @pl.when(m0 < rows)
        def _():
            scale_bytes = []
            for p in range(ACT_BLOCK // PASS):
                block_scaled_k_loop(
                    (a_ref, sa_ref, w_ref, sw_ref), s, e, m_block, 2 * block + p, 2 * PASS,
                    bk, stages, k_steps, step0=p * k_steps,
                    before_mma=(lambda: plgpu.barrier_wait(s["acc_read"])) if p else None)
                plgpu.barrier_wait(s["mma_done"])
                scale_bytes += quantize_pass(read_quarters, s["q_smem"], p, alpha_ref[e],
                                             gs_ref[e])
                if p + 1 < ACT_BLOCK // PASS:
                    plgpu.barrier_arrive(s["acc_read"])
            store_tile(scale_bytes, s, q_ref, s_ref, e, m_block, block, rows)

    call = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((experts, m, n // 2), jnp.uint8),
                  jax.ShapeDtypeStruct((experts, *scale_atoms(m, n), 32, 16), jnp.uint8)),
        grid=(experts, n // ACT_BLOCK, m // BLOCK_M),
        grid_names=("experts", "act_blocks", "m_blocks"),
        scratch_types=scratch_types(config))

    def run(a1, a1_scales, w1, w1_scales, alpha1, a2_gs, masked_m):
        packed, scales = call(as_e2m1(a1), as_e4m3(a1_scales), as_e2m1(w1), as_e4m3(w1_scales),
                              alpha1, a2_gs, masked_m)
        return packed, scales.reshape(experts, -1)

    return arguments.checked(run, ("a1", "a1_scales", "w1_fused", "w1_scales_fused",
                                   "alpha1", "a2_gs", "masked_m"),
                             arg_shapes(experts, m, n, k), m, {})


def quarter_columns(c: int) -> list[int]:
    """The accumulator columns of chunk c in each quarter (gate even, gate odd, up even,
    up odd: ``layouts.gate_up_order``)."""
    return [q * PASS // 2 + c * CHUNK for q in range(4)]


def quantize_pass(read_quarters, q_smem, p: int, alpha, gs) -> list:
    """Pass p's 128 act columns from the accumulator (``read_quarters(c)``: chunk c of
    its four quarters, [128, CHUNK] f32 each in LAYOUT): alpha, SiLU·mul and the NVFP4
    quantize; codes into q_smem's columns p*64.., the 8 scale byte vectors returned."""
    scale_bytes = []
    for c in range(PASS // 2 // CHUNK):
        gate_even, gate_odd, up_even, up_odd = read_quarters(c)
        packed, found = quantize_pair(silu_mul(gate_even * alpha, up_even * alpha),
                                      silu_mul(gate_odd * alpha, up_odd * alpha), gs,
                                      layout=LAYOUT)
        q_smem[:, pl.ds(p * PASS // 2 + c * CHUNK, CHUNK)] = packed.astype(jnp.uint8)
        scale_bytes += found
    return scale_bytes


def store_tile(scale_bytes, s, q_ref, s_ref, e, m_block, block, rows) -> None:
    """The CTA's codes (rows below ``rows`` only) and its 16 scale byte vectors, as four
    128x4 atoms, TMA-stored; waits for both stores."""
    shape = s["s_smem"].shape
    empty = plgpu.layout_cast(jnp.zeros(shape, jnp.int32), LAYOUT)
    s["s_smem"][...] = scale_tile(scale_bytes, shape, 0, empty, layout=LAYOUT)
    plgpu.commit_smem()
    store_valid_rows(s["q_smem"], q_ref, e, m_block * BLOCK_M, block * (ACT_BLOCK // 2),
                     rows, BLOCK_M, ACT_BLOCK // 2)
    store_atoms(s["s_smem"], s["atoms_smem"], s_ref, e, m_block,
                block * (ACT_BLOCK // ATOM_K))
    plgpu.wait_smem_to_gmem(0)


def arg_shapes(experts: int, m: int, n: int, k: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    u8, f32 = jnp.uint8, jnp.float32
    return (jax.ShapeDtypeStruct((experts, m, k // 2), u8),
            jax.ShapeDtypeStruct((experts, *scale_atoms(m, k), 32, 16), u8),
            jax.ShapeDtypeStruct((experts, 2 * n, k // 2), u8),
            jax.ShapeDtypeStruct((experts, *scale_atoms(2 * n, k), 32, 16), u8),
            jax.ShapeDtypeStruct((experts,), f32), jax.ShapeDtypeStruct((experts,), f32),
            jax.ShapeDtypeStruct((experts,), jnp.int32))
