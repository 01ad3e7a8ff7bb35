"""The port's variants: structural choices from the reference's design space, each a
frozen configuration that checks itself, and the JAX function it runs on the case's
inputs (returning the named outputs it computes).

Axes: tile shape (64×64, 128×128, 64×128), TMA pipelining depth (2–4 stages),
scheduling (one tile per CTA vs persistent CTAs walking the tile list, as the
reference's persistent kernel), and fused vs unfused stages (GEMM1 + SiLU·mul +
requantize in one kernel, or GEMM1 writing h in bf16, SiLU·mul in XLA and the quantize
kernel), scale placement (the quantize writing row-major scales, the Hopper GEMM's
operand, or the reference's 128x4 layout), fused vs unfused stages, and the target:
Hopper (sm_90a: NVFP4 decoded in registers, bf16 wgmma) or Blackwell (sm_100a: the
tensor cores' block-scaled NVFP4 MMA, ``mgpu_gemm_sm100`` and ``mgpu_fused_sm100``;
lowered only, as no interpreter runs it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from kernels.moe_nvfp4 import (
    arguments,
    mgpu_fused,
    mgpu_fused_sm100,
    mgpu_gemm,
    mgpu_gemm_sm100,
    mgpu_quantize,
)

H100_SMS = 132  # persistent CTAs: one per SM of an H100 SXM (the reference's sm_count)
SCALES_128X4 = "swizzled_128x4"
BLACKWELL = (mgpu_gemm_sm100.TuningConfig, mgpu_fused_sm100.FusedConfig)  # sm_100a kernels


@dataclasses.dataclass(frozen=True)
class Variant:
    """Which kernels run, with which configuration; None: the stage is not run. A GEMM
    or fused kernel configured for sm_100a (``BLACKWELL``) makes a Blackwell variant,
    whose MMA kernels must all be Blackwell kernels; its quantize (no MMA: the same kernel on
    either architecture) must write the 128x4 scale layout the block-scaled MMA reads."""

    description: str
    quantize: mgpu_quantize.QuantizeConfig | None = None
    gemm1: mgpu_gemm.TuningConfig | mgpu_gemm_sm100.TuningConfig | None = None
    fused: mgpu_fused.FusedConfig | mgpu_fused_sm100.FusedConfig | None = None
    gemm2: mgpu_gemm.TuningConfig | mgpu_gemm_sm100.TuningConfig | None = None

    def __post_init__(self):
        stages = [self.quantize, self.gemm1 or self.fused, self.gemm2]
        blackwell = [isinstance(s, BLACKWELL) for s in stages[1:] if s]
        if any(blackwell) and not all(blackwell):
            raise ValueError(f"a variant runs on one target: sm_100a and sm_90a kernels "
                             f"mixed in {self}")
        if any(blackwell) and self.quantize and self.quantize.scale_layout != SCALES_128X4:
            raise ValueError(f"a Blackwell variant's quantize must write the "
                             f"{SCALES_128X4} scales its MMA reads, not "
                             f"{self.quantize.scale_layout}")
        if self.gemm1 and self.fused:
            raise ValueError("GEMM1 runs either unfused (gemm1) or fused, not both")
        ran = [i for i, s in enumerate(stages) if s is not None]
        if not ran or ran != list(range(ran[0], ran[-1] + 1)):
            raise ValueError(f"the stages run must be contiguous, got {self}")
        if self.gemm1 and self.gemm2 and self.quantize is None:
            raise ValueError("an unfused GEMM1 -> GEMM2 chain needs the quantize kernel")

    @property
    def arch(self) -> str:
        """The GPU architecture its kernels are written for."""
        return ("sm_100a" if isinstance(self.gemm1 or self.fused or self.gemm2, BLACKWELL)
                else "sm_90a")

    def outputs(self) -> tuple[str, ...]:
        found = ["a1"] if self.quantize else []
        if self.gemm1:
            found.append("h")
        if self.fused:
            found.append("a2")
        if self.gemm2:  # GEMM2 alone reads the model's a2; a whole path its own
            found.append("out" if not self.quantize else
                         "out_unfused" if self.gemm1 else "out_fused")
        return tuple(found)


def intermediates(variant: Variant, e: int, m: int, k: int, n: int) -> list[dict[str, Any]]:
    """The tensors one kernel of the variant writes to memory and the next reads back, at
    capacity (all M rows: the GEMMs write only rows below masked_m, XLA's SiLU·mul every
    row), in bytes: NVFP4 codes at half a byte and a scale byte per 16."""
    def nvfp4(cols):
        return e * m * cols // 2 + e * m * cols // 16

    found = []
    if variant.quantize and (variant.gemm1 or variant.fused):
        found.append({"tensor": "a1: NVFP4 [E, M, K] and its scales", "bytes": nvfp4(k)})
    if variant.gemm1 and variant.gemm2:
        found += [{"tensor": "h: bf16 [E, M, 2N] (GEMM1 -> SiLU·mul)", "bytes": e * m * 2 * n * 2},
                  {"tensor": "act: bf16 [E, M, N] (SiLU·mul -> quantize)", "bytes": e * m * n * 2}]
    if variant.gemm2 and (variant.gemm1 or variant.fused):
        found.append({"tensor": "a2: NVFP4 [E, M, N] and its scales", "bytes": nvfp4(n)})
    return found


def tiles(m, n, s, ctas=0):
    """A GEMM tuning: block_m, block_n, stages, persistent CTAs (0: one tile per CTA)."""
    return mgpu_gemm.TuningConfig(m, n, s, persistent_ctas=ctas)


VARIANTS = {
    "quantize": Variant("Stage 1 alone: the grouped NVFP4 quantize kernel.",
                        quantize=mgpu_quantize.QuantizeConfig(64)),
    "quantize_128x4": Variant("Stage 1 alone, scales written in the reference's 128x4 "
                              "layout (what Blackwell's block-scaled MMA reads).",
                              quantize=mgpu_quantize.QuantizeConfig(128, SCALES_128X4)),
    "gemm1_m64n64s2": Variant("Stage 2 alone: masked grouped GEMM, 64×64 tiles, 2-stage "
                              "TMA ring, one tile per CTA.", gemm1=tiles(64, 64, 2)),
    "gemm1_m128n128s3": Variant("Stage 2 alone: 128×128 tiles, 3 stages.",
                                gemm1=tiles(128, 128, 3)),
    "gemm1_m64n128s4": Variant("Stage 2 alone: 64×128 tiles, 4 stages (deepest ring).",
                               gemm1=tiles(64, 128, 4)),
    "gemm1_persistent": Variant(f"Stage 2 alone: 128×128 tiles, 2 stages, persistent: "
                                f"{H100_SMS} CTAs (at most one per tile) walk the tiles.",
                                gemm1=tiles(128, 128, 2, H100_SMS)),
    "fused": Variant("Stages 2–3 in one kernel: GEMM1 + SiLU·mul + NVFP4 requantize, the "
                     "[E, M, 2N] intermediate only in registers.",
                     fused=mgpu_fused.FusedConfig(64, 2)),
    "gemm2_m128n128s3": Variant("Stage 4 alone: GEMM2 on the requantized act, 128×128, 3 "
                                "stages.", gemm2=tiles(128, 128, 3)),
    "gemm1_sm100a_n128k256s3": Variant(
        "Stage 2 alone for Blackwell (sm_100a): the tensor cores' block-scaled NVFP4 MMA "
        "(tcgen05, accumulator in tensor memory), 128×128 tiles, 256 K per step, 3 stages.",
        gemm1=mgpu_gemm_sm100.TuningConfig(128, 256, 3)),
    "gemm2_sm100a_n128k256s3": Variant(
        "Stage 4 alone for Blackwell (sm_100a): GEMM2 on the block-scaled NVFP4 MMA, "
        "128×128 tiles, 256 K per step, 3 stages.",
        gemm2=mgpu_gemm_sm100.TuningConfig(128, 256, 3)),
    "moe_unfused_sm100a": Variant(
        "The whole path, unfused, for Blackwell (sm_100a): quantize (128x4 scales) -> "
        "GEMM1 on the block-scaled NVFP4 MMA (h in bf16 in memory) -> SiLU·mul in XLA -> "
        "quantize -> GEMM2 on the block-scaled MMA.",
        quantize=mgpu_quantize.QuantizeConfig(128, SCALES_128X4),
        gemm1=mgpu_gemm_sm100.TuningConfig(128, 256, 3),
        gemm2=mgpu_gemm_sm100.TuningConfig(128, 256, 3)),
    "fused_sm100a_k256s3": Variant(
        "Stages 2–3 in one kernel for Blackwell (sm_100a): GEMM1 on the block-scaled NVFP4 "
        "MMA, gate and up in tensor memory, SiLU·mul and the NVFP4 requantize in the "
        "epilogue, scales written in the 128x4 layout; 256 K per step, 3 stages.",
        fused=mgpu_fused_sm100.FusedConfig(256, 3)),
    "moe_fused_sm100a": Variant(
        "The whole path, fused, for Blackwell (sm_100a): quantize (128x4 scales) -> fused "
        "GEMM1+SiLU·mul+requantize on the block-scaled NVFP4 MMA -> GEMM2 on the "
        "block-scaled MMA.", quantize=mgpu_quantize.QuantizeConfig(128, SCALES_128X4),
        fused=mgpu_fused_sm100.FusedConfig(256, 3),
        gemm2=mgpu_gemm_sm100.TuningConfig(128, 256, 3)),
    "moe_fused": Variant("The whole path, fused: quantize -> fused GEMM1+SiLU·mul+"
                         "requantize -> GEMM2.", quantize=mgpu_quantize.QuantizeConfig(64),
                         fused=mgpu_fused.FusedConfig(64, 2), gemm2=tiles(128, 128, 3)),
    "moe_unfused": Variant("The whole path, unfused: quantize -> GEMM1 (h in bf16 in "
                           "memory) -> SiLU·mul in XLA -> quantize -> GEMM2.",
                           quantize=mgpu_quantize.QuantizeConfig(64),
                           gemm1=tiles(128, 128, 3), gemm2=tiles(128, 128, 3)),
}


def with_tiles(variant: Variant, tiles: dict[str, int] | None) -> Variant:
    """The variant with a point's tile row (``params["tiles"]``: the case config's, or the
    target's tuned table's) in place of its GEMM's hand-chosen tiles. A row is for the
    variants that run one Hopper GEMM alone (``single_gemm``); every other variant keeps
    its own configuration, as it does without a row."""
    stage = single_gemm(variant)
    if not tiles or stage is None:
        return variant
    return dataclasses.replace(variant, **{stage: mgpu_gemm.TuningConfig(**tiles)})


def single_gemm(variant: Variant) -> str | None:
    """The stage (``gemm1`` or ``gemm2``) of a variant that runs one Hopper GEMM alone;
    None for any other."""
    stages = [s for s in ("gemm1", "gemm2") if getattr(variant, s) is not None]
    if variant.arch != "sm_90a" or variant.quantize or variant.fused or len(stages) != 1:
        return None
    return stages[0]


def _gemm_problem(e, m, n, k, config):
    if config.persistent_ctas:  # no more CTAs than tiles
        tiles = e * (m // config.block_m) * (n // config.block_n)
        config = dataclasses.replace(config, persistent_ctas=min(config.persistent_ctas, tiles))
    return mgpu_gemm.Problem(e, m, n, k), config


def _quantize_shapes(e, m, k):
    return (jax.ShapeDtypeStruct((e, m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((e,), jnp.float32), jax.ShapeDtypeStruct((e,), jnp.int32))


def kernels(variant: Variant, e: int, m: int, k: int, n: int, interpret: Any = None
            ) -> dict[str, tuple[Any, Any, tuple]]:
    """Each kernel of the variant for hidden k, inter n: (function, its configuration,
    its argument shapes)."""
    made: dict[str, tuple[Any, Any, tuple]] = {}
    if variant.quantize:
        made["quantize"] = (mgpu_quantize.make(e, m, k, variant.quantize, interpret),
                            variant.quantize, _quantize_shapes(e, m, k))
        if variant.gemm1 and variant.gemm2:
            made["requantize"] = (mgpu_quantize.make(e, m, n, variant.quantize, interpret),
                                  variant.quantize, _quantize_shapes(e, m, n))
    if variant.gemm1:
        made["gemm1"] = _gemm(e, m, 2 * n, k, variant.gemm1, interpret)
    if isinstance(variant.fused, mgpu_fused_sm100.FusedConfig):
        if interpret is not None:
            raise ValueError("no interpreter runs an sm_100a kernel (tcgen05, tensor memory)")
        made["fused"] = (mgpu_fused_sm100.make(e, m, n, k, variant.fused), variant.fused,
                         mgpu_fused_sm100.arg_shapes(e, m, n, k))
    elif variant.fused:
        made["fused"] = (mgpu_fused.make(e, m, n, k, variant.fused, interpret), variant.fused,
                         mgpu_fused.arg_shapes(e, m, n, k))
    if variant.gemm2:
        made["gemm2"] = _gemm(e, m, k, n, variant.gemm2, interpret)
    return made


def _gemm(e, m, n, k, config, interpret):
    if isinstance(config, mgpu_gemm_sm100.TuningConfig):
        if interpret is not None:
            raise ValueError("no interpreter runs an sm_100a kernel (tcgen05, tensor memory)")
        problem = mgpu_gemm.Problem(e, m, n, k)
        return (mgpu_gemm_sm100.make(problem, config), config,
                mgpu_gemm_sm100.arg_shapes(problem))
    problem, config = _gemm_problem(e, m, n, k, config)
    return mgpu_gemm.make(problem, config, interpret), config, mgpu_gemm.arg_shapes(problem)


INPUTS = ("hidden_bf16", "masked_m", "a1_gs", "a2_gs", "alpha1", "alpha2", "a1_packed",
          "a1_scales", "a2_packed", "a2_scales", "w1_t", "w1_t_scales", "w1_f",
          "w1_f_scales", "w2_t", "w2_t_scales", "a1_scales_128x4", "a2_scales_128x4",
          "w1_packed", "w1_scales_128x4", "w2_packed", "w2_scales_128x4", "w1_f_sm100",
          "w1_f_sm100_scales_128x4")
K_PAIR_MAJOR = "layouts.k_pair_major: codes [E, K/2, N], scales [E, K/16, N]"
INPUT_NOTES = {"a1_scales": arguments.ROW_MAJOR, "a2_scales": arguments.ROW_MAJOR,
               **dict.fromkeys(("w1_t", "w1_t_scales", "w2_t", "w2_t_scales"), K_PAIR_MAJOR),
               **dict.fromkeys(("w1_f", "w1_f_scales"), "layouts.fused_w1"),
               **dict.fromkeys(("w1_f_sm100", "w1_f_sm100_scales_128x4"),
                               "layouts.fused_w1_sm100"),
               **dict.fromkeys(("a1_scales_128x4", "a2_scales_128x4", "w1_scales_128x4",
                                "w2_scales_128x4"), "numerics.scale_atoms: the 128x4 layout's "
                                                    "atoms [E, M/128, K/64, 32, 16]")}


def input_shapes(e: int, m: int, k: int, n: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Each of INPUTS' shape and dtype: what the kernel that reads it needs."""
    hidden, gs, masked = _quantize_shapes(e, m, k)
    a1, a1_scales, w1_t, w1_t_scales, alpha, _ = mgpu_gemm.arg_shapes(
        mgpu_gemm.Problem(e, m, 2 * n, k))
    _, _, w1_f, w1_f_scales, *_ = mgpu_fused.arg_shapes(e, m, n, k)
    a2, a2_scales, w2_t, w2_t_scales, *_ = mgpu_gemm.arg_shapes(mgpu_gemm.Problem(e, m, k, n))
    _, a1_atoms, w1, w1_atoms, *_ = mgpu_gemm_sm100.arg_shapes(
        mgpu_gemm.Problem(e, m, 2 * n, k))
    _, a2_atoms, w2, w2_atoms, *_ = mgpu_gemm_sm100.arg_shapes(
        mgpu_gemm.Problem(e, m, k, n))
    _, _, w1_f_sm100, w1_f_sm100_atoms, *_ = mgpu_fused_sm100.arg_shapes(e, m, n, k)
    return (hidden, masked, gs, gs, alpha, alpha, a1, a1_scales, a2, a2_scales, w1_t,
            w1_t_scales, w1_f, w1_f_scales, w2_t, w2_t_scales, a1_atoms, a2_atoms, w1,
            w1_atoms, w2, w2_atoms, w1_f_sm100, w1_f_sm100_atoms)


def _as_gemm_operand(variant: Variant, scales, rows: int, k: int):
    """The quantize's scales as the variant's GEMM reads them: a Blackwell GEMM takes the
    128x4 layout's bytes as its atoms [E, rows/128, k/64, 32, 16] (a reshape: the
    quantize writes them atom after atom)."""
    if variant.arch != "sm_100a":
        return scales
    return scales.reshape(scales.shape[0], *mgpu_gemm_sm100.scale_atoms(rows, k), 32, 16)


def function(variant: Variant, e: int, m: int, k: int, n: int, interpret: Any = None):
    """``f(*INPUTS) -> {output: raw kernel output}`` (codes stay packed bytes here), every
    input checked (``input_shapes``, masked_m in [0, m]) before any kernel is traced."""
    run = {stage: fn for stage, (fn, _, _) in kernels(variant, e, m, k, n, interpret).items()}

    def path(hidden, masked, a1_gs, a2_gs, alpha1, alpha2, a1_packed, a1_scales,
             a2_packed, a2_scales, w1_t, w1_t_scales, w1_f, w1_f_scales, w2_t, w2_t_scales,
             a1_atoms, a2_atoms, w1, w1_atoms, w2, w2_atoms, w1_f_sm100, w1_f_sm100_atoms):
        if variant.arch == "sm_100a":  # the reference's operands: K-major codes, 128x4 scales
            w1_t, w1_t_scales, a1_scales = w1, w1_atoms, a1_atoms
            w2_t, w2_t_scales, a2_scales = w2, w2_atoms, a2_atoms
            w1_f, w1_f_scales = w1_f_sm100, w1_f_sm100_atoms
        found = {}
        if variant.quantize:
            a1_packed, a1_scales = run["quantize"](hidden, a1_gs, masked)
            found["a1"] = (a1_packed, a1_scales)
            a1_scales = _as_gemm_operand(variant, a1_scales, m, k)
        if variant.gemm1:
            h = run["gemm1"](a1_packed, a1_scales, w1_t, w1_t_scales, alpha1, masked)
            found["h"] = h
            if variant.gemm2:  # SiLU·mul in XLA on bf16 h, then the quantize kernel
                gate, up = jnp.split(h.astype(jnp.float32), 2, axis=-1)
                act = (jax.nn.silu(gate) * up).astype(jnp.bfloat16)
                a2_packed, a2_scales = run["requantize"](act, a2_gs, masked)
                a2_scales = _as_gemm_operand(variant, a2_scales, m, n)
        if variant.fused:
            a2_packed, a2_scales = run["fused"](a1_packed, a1_scales, w1_f, w1_f_scales,
                                                alpha1, a2_gs, masked)
            found["a2"] = (a2_packed, a2_scales)
            a2_scales = _as_gemm_operand(variant, a2_scales, m, n)
        if variant.gemm2:
            found[variant.outputs()[-1]] = run["gemm2"](a2_packed, a2_scales, w2_t,
                                                        w2_t_scales, alpha2, masked)
        return found

    return arguments.checked(path, INPUTS, input_shapes(e, m, k, n), m, INPUT_NOTES)
