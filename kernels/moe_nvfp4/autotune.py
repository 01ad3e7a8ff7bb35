"""Case 01's tuning loop: the Hopper GEMM's tile candidates for one problem, what the
autotune rule measures (as case 02's ``autotune``).

Numpy-only (no lowering, no device): every candidate is a ``tiles`` row (block_m,
block_n, stages, persistent_ctas) a point could carry in the case config, kept when the
GEMM's sizes are multiples of its tile and its shared memory fits the budget, rejected
with the reason otherwise. The casebook side (``casebook.stages.autotune``) verifies and times
the kept ones, picks one, and records whether the pick is the variant's hand choice.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels.moe_nvfp4 import inputs, mgpu_gemm, port
from kernels.moe_nvfp4.mgpu_mainloop import SMEM_LIMIT_BYTES

# The searched space: both tile heights one warpgroup holds, the widths the variants
# use, every ring depth the kernel allows beyond one slot, one tile per CTA or persistent
# CTAs (one per SM of an H100 SXM, as the reference's sm_count).
SPACE = {"block_m": (64, 128), "block_n": (64, 128, 256), "stages": (2, 3, 4),
         "persistent_ctas": (0, port.H100_SMS)}
TIE_RULE = "fewer stages, then one tile per CTA, then the smaller tile"


TUNABLE = tuple(name for name, v in port.VARIANTS.items() if port.single_gemm(v))


def tunable(variant: str) -> str:
    """The stage a variant's tiles tune (``gemm1`` or ``gemm2``): variants that run one
    Hopper GEMM alone; anything else is refused, naming the tunable ones."""
    stage = port.single_gemm(port.VARIANTS[variant]) if variant in port.VARIANTS else None
    if stage is None:
        raise ValueError(f"variant {variant!r} has no tile choice; tunable: {TUNABLE}")
    return stage


def tie_order(tiles: dict[str, int]) -> tuple[int, int, int]:
    """Among candidates whose times cannot be told apart (``TIE_RULE``)."""
    return tiles["stages"], int(tiles["persistent_ctas"] > 0), tiles["block_m"] * tiles["block_n"]


def hand(variant: str) -> dict[str, int]:
    """The tiles the variant's configuration chose by hand (``port.VARIANTS``)."""
    return dataclasses.asdict(getattr(port.VARIANTS[variant], tunable(variant)))


def tile_candidates(variant: str, params: dict[str, Any],
                    space: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """``{"key": "tiles", "kept": [{tiles, smem_bytes, tie_order}], "rejected": [{tiles,
    smem_bytes, reason}], "smem_limit_bytes", "tie_rule", "hand"}`` over ``space``
    (default ``SPACE``)."""
    stage = tunable(variant)
    e, m, k, n = inputs.sizes(params)
    problem = (mgpu_gemm.Problem(e, m, 2 * n, k) if stage == "gemm1"
               else mgpu_gemm.Problem(e, m, k, n))
    space = space or SPACE
    kept, rejected = [], []
    for values in itertools.product(*space.values()):
        tiles = dict(zip(space, values, strict=True))
        config = mgpu_gemm.TuningConfig(**tiles)
        try:
            problem.check(config)
        except ValueError as error:
            rejected.append({"tiles": tiles, "smem_bytes": None, "reason": str(error)})
            continue
        smem = {stage: mgpu_gemm.smem_bytes(config)}
        if smem[stage] > SMEM_LIMIT_BYTES:
            rejected.append({"tiles": tiles, "smem_bytes": smem, "reason": (
                f"shared memory {smem[stage]:,} B over the {SMEM_LIMIT_BYTES:,}-byte limit")})
        else:
            kept.append({"tiles": tiles, "smem_bytes": smem, "tie_order": list(tie_order(tiles))})
    return {"key": "tiles", "kept": kept, "rejected": rejected,
            "smem_limit_bytes": SMEM_LIMIT_BYTES, "tie_rule": TIE_RULE, "hand": hand(variant)}
