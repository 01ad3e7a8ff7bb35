"""The tile candidates for one problem: what the autotune rule measures.

Numpy-only (no lowering, no device): for the port, every candidate is a ``tiles`` (forward
variants) or ``bwd_tiles`` (``mgpu_bwd``) row a point could carry in the case config, kept
when the sequence is a multiple of its blocks and every kernel it launches fits the
shared-memory budget (``mgpu_forward.SMEM_LIMIT_BYTES``), rejected with the reason
otherwise; for upstream on a TPU, one block size for all of its kernels
(``upstream_blocks`` / ``upstream_bwd_blocks``), kept when the sequence is a multiple of
it. The casebook side (``casebook.autotune``) verifies and times the kept ones and picks one.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from kernels.splash_attention import mgpu_backward, mgpu_forward, port, upstream

# The searched space: the block widths the port's tests and fuzz run (64, 128), every
# ring depth the configs allow, one or two compute warpgroups.
FORWARD_SPACE = {"block_q": (64, 128), "block_kv": (64, 128), "stages": (1, 2, 3, 4),
                 "compute_wgs": (1, 2)}
BACKWARD_SPACE = {"block_q": (64, 128), "block_kv": (64, 128), "stages": (1, 2, 3)}
# Upstream on a TPU: one block size for q and kv in every kernel, as
# benchmarks/tpu_block_sweep.py swept 128-1024 (256 was never the fastest there, 2-3x
# slower than 512, so it is not searched). 128 is upstream's BlockSizes default: always a
# candidate, so the record times the default beside the pick.
UPSTREAM_SPACE = {"block": (upstream.DEFAULT_BLOCK, 512, 1024)}
UPSTREAM_TIE_RULE = "the smaller block (less VMEM, fewer masked-out keys computed)"


def tuned_key(variant: str) -> str:
    """The point key a variant's tile choice lives in: ``tiles`` or ``bwd_tiles`` (the
    port), ``upstream_blocks`` or ``upstream_bwd_blocks`` (upstream)."""
    if variant in upstream.TUNED_KEYS:
        return upstream.TUNED_KEYS[variant]
    if variant in port.BACKWARD_VARIANTS:
        return "bwd_tiles"
    if variant in port.FORWARD_VARIANTS:
        return "tiles"
    raise ValueError(f"variant {variant!r} has no tile choice; tunable: "
                     f"{(*port.VARIANTS, *upstream.TUNED_KEYS)}")


def _grid(space: dict[str, tuple[int, ...]]) -> list[dict[str, int]]:
    return [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]


def _smem(variant: str, params: dict[str, Any], tiles: dict[str, int]) -> dict[str, int]:
    """Shared memory of every kernel the variant launches with ``tiles`` (bytes)."""
    problem = port.problem(params)
    if variant in port.BACKWARD_VARIANTS:
        return mgpu_backward.smem_bytes(problem, mgpu_backward.BackwardConfig(**tiles),
                                        has_tiles=False)
    return {"forward": mgpu_forward.smem_bytes(problem, mgpu_forward.TuningConfig(**tiles),
                                               has_tiles=variant == "mgpu_mask_tiles")}


def _invalid(params: dict[str, Any], tiles: dict[str, int]) -> str | None:
    if tiles.get("compute_wgs", 1) == 2 and tiles["block_q"] != 128:
        return "two compute warpgroups need block_q 128"
    for block in ("block_q", "block_kv"):
        if params["seq_len"] % tiles[block]:
            return f"seq_len {params['seq_len']} is not a multiple of {block} {tiles[block]}"
    return None


TIE_RULE = "fewer stages, then fewer compute warpgroups"


def tie_order(tiles: dict[str, int]) -> tuple[int, int]:
    """Among candidates whose times cannot be told apart: fewer stages, then fewer compute
    warpgroups (less shared memory, fewer threads), first (``TIE_RULE``)."""
    return tiles["stages"], tiles.get("compute_wgs", 1)


def tile_candidates(variant: str, params: dict[str, Any],
                    space: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """``{"key", "kept": [{tiles, smem_bytes, tie_order}], "rejected": [{tiles,
    smem_bytes, reason}], "smem_limit_bytes", "tie_rule", "hand"}`` over ``space``
    (default: the variant's)."""
    key = tuned_key(variant)
    if variant in upstream.TUNED_KEYS:
        return _block_candidates(variant, params, space or UPSTREAM_SPACE)
    space = space or (BACKWARD_SPACE if key == "bwd_tiles" else FORWARD_SPACE)
    kept, rejected = [], []
    for tiles in _grid(space):
        why = _invalid(params, tiles)
        if why:
            rejected.append({"tiles": tiles, "smem_bytes": None, "reason": why})
            continue
        smem = _smem(variant, params, tiles)
        over = {k: b for k, b in smem.items() if b > mgpu_forward.SMEM_LIMIT_BYTES}
        if over:
            rejected.append({"tiles": tiles, "smem_bytes": smem, "reason": "shared memory "
                             + ", ".join(f"{k} {b:,} B" for k, b in over.items())
                             + f" over the {mgpu_forward.SMEM_LIMIT_BYTES:,}-byte limit"})
        else:
            kept.append({"tiles": tiles, "smem_bytes": smem, "tie_order": list(tie_order(tiles))})
    return {"key": key, "kept": kept, "rejected": rejected,
            "smem_limit_bytes": mgpu_forward.SMEM_LIMIT_BYTES, "tie_rule": TIE_RULE,
            "hand": hand(variant, params)}


def _block_candidates(variant: str, params: dict[str, Any],
                      space: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Upstream's block sizes: no shared memory (a TPU kernel's blocks live in VMEM,
    which Mosaic checks when it compiles), kept where the sequence is a multiple."""
    kept, rejected = [], []
    for tiles in _grid(space):
        if params["seq_len"] % tiles["block"]:
            rejected.append({"tiles": tiles, "smem_bytes": None, "reason": f"seq_len "
                             f"{params['seq_len']} is not a multiple of block {tiles['block']}"})
        else:
            kept.append({"tiles": tiles, "smem_bytes": {}, "tie_order": [tiles["block"]]})
    return {"key": tuned_key(variant), "kept": kept, "rejected": rejected,
            "smem_limit_bytes": None, "tie_rule": UPSTREAM_TIE_RULE,
            "hand": hand(variant, params)}


def hand(variant: str, params: dict[str, Any]) -> dict[str, int]:
    """The tiles the variant runs at ``params`` without a table: the config's row, or the
    port's default rule; upstream's ``block`` (default 128, its BlockSizes default)."""
    if variant in upstream.TUNED_KEYS:
        return {"block": upstream.block(params, variant)}
    if tuned_key(variant) == "bwd_tiles":
        return dataclasses.asdict(port.backward_tuning(params))
    return dataclasses.asdict(port.tuning(params))
