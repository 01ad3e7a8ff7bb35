"""Ablations of the port's variants: a verified variant's kernels with one part of the
work switched off, to show where the time goes. An ablation computes a wrong result on
purpose (or the right one another way); it is never verified as a port.

- ``moe_fused_no_fusion``: the whole fused path with fusion off: GEMM1 writes h in bf16
  (64-row tiles and the fused kernel's ring depth), SiLU·mul in XLA, the quantize kernel
  requantizes;
- ``moe_fused_given_scales``: the whole fused path with every NVFP4 block scale taken as
  given (``mgpu_quantize.GIVEN_SCALE``) instead of produced: no amax and no scale
  rounding, in the quantize and in the fused requantize;
- ``gemm1_no_persistent``: the persistent GEMM1 with one tile per CTA.

Each is derived from its variant's configuration at the point (a point's tile row
applied first), so it follows the variant when the variant changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kernels.moe_nvfp4 import mgpu_gemm
from kernels.moe_nvfp4.port import Variant


@dataclasses.dataclass(frozen=True)
class Ablation:
    of: str  # the verified variant it switches a part of off
    switches_off: str  # the part, in words
    derive: Callable[[Variant], Variant]  # the variant's configuration -> the ablation's
    refuse: Callable[[Variant], str | None] = lambda variant: None  # why it changes nothing


def _no_fusion(variant: Variant) -> Variant:
    fused = variant.fused
    return dataclasses.replace(
        variant, description="ablation: fusion off", fused=None,
        gemm1=mgpu_gemm.TuningConfig(fused.block_m, 128, fused.stages))


def _given_scales(variant: Variant) -> Variant:
    return dataclasses.replace(
        variant, description="ablation: scales given, not produced",
        quantize=dataclasses.replace(variant.quantize, produce_scales=False),
        fused=dataclasses.replace(variant.fused, produce_scales=False))


def _no_persistent(variant: Variant) -> Variant:
    return dataclasses.replace(
        variant, description="ablation: persistent schedule off",
        gemm1=dataclasses.replace(variant.gemm1, persistent_ctas=0))


ABLATIONS = {
    "moe_fused_no_fusion": Ablation(
        "moe_fused", "fusion (h written in bf16, SiLU·mul in XLA, a separate requantize)",
        _no_fusion),
    "moe_fused_given_scales": Ablation(
        "moe_fused", "producing the NVFP4 block scales (each block's scale taken as given)",
        _given_scales),
    "gemm1_no_persistent": Ablation(
        "gemm1_persistent", "the persistent schedule (one tile per CTA)", _no_persistent,
        lambda v: "the GEMM runs one tile per CTA already" if not v.gemm1.persistent_ctas
        else None),
}


def find(name: str) -> Ablation:
    if name not in ABLATIONS:
        raise ValueError(f"unknown moe_nvfp4 ablation {name!r}; known: {sorted(ABLATIONS)}")
    return ABLATIONS[name]


def configured(name: str, variant: Variant) -> Variant:
    """The ablation's configuration from its variant's (``variant``, tiles applied)."""
    ablation = find(name)
    why = ablation.refuse(variant)
    if why:
        raise ValueError(f"{name} does not apply: {why}")
    return ablation.derive(variant)
