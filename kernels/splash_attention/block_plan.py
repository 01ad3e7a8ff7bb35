"""The kernel's block plan from upstream MaskInfo (numpy only, no accelerator).

Upstream ``process_mask`` classifies every (head, q-block, kv-block) tile of a mask as
empty (0), partial (1) or full (2) and keeps the distinct partial tiles once. The Mosaic
GPU kernel walks, for each (head, q-block), only the non-empty kv blocks, so the plan
compacts each row of the class table: ``kv_block[h, i, t]`` is the t-th non-empty kv
block, ``kind[h, i, t]`` its class and ``mask_block[h, i, t]`` the index of its tile in
``partial_blocks`` (for partial tiles); ``count[h, i]`` says how many there are. Empty
tiles never appear, so they are never loaded or computed.

A single mask that upstream can evaluate from indices (causal, local, chunked causal)
comes with its ``mask_function``: the kernel then evaluates partial tiles from iota, as
upstream does, and no mask tile exists; otherwise (numpy masks, combinations, per-head
masks) partial tiles are loaded from ``partial_blocks``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

EMPTY, PARTIAL, FULL = 0, 1, 2  # upstream MaskInfo's block classes


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    kv_block: np.ndarray  # int32 [mask_heads, q_blocks, kv_blocks], compacted per row
    kind: np.ndarray  # int32, same shape: PARTIAL or FULL (padding: EMPTY)
    mask_block: np.ndarray  # int32, same shape: index into partial_blocks
    count: np.ndarray  # int32 [mask_heads, q_blocks]: non-empty kv blocks per row
    partial_blocks: np.ndarray  # bool [max(1, partial tiles), block_q, block_kv]
    classes: np.ndarray  # int8 [mask_heads, q_blocks, kv_blocks]: upstream's table
    mask_function: Callable | None  # (q_ids, kv_ids) -> visible, or None: use the tiles

    @property
    def mask_heads(self) -> int:
        """1 when every head shares one mask (the table is broadcast), else heads_q."""
        return int(self.count.shape[0])

    def census(self) -> dict[str, int]:
        return {name: int((self.classes == code).sum())
                for code, name in ((EMPTY, "empty"), (PARTIAL, "partial"), (FULL, "full"))}


def plan(mask: mask_lib.MultiHeadMask, block_q: int, block_kv: int) -> BlockPlan:
    """Classify ``mask`` with upstream's MaskInfo and compact it for the kernel."""
    info, mask_function = splash_attention_mask_info.process_mask(
        mask, (block_q, block_kv), downcast_smem_data=False, shrink_grid=False)
    if info.q_sequence is not None and not np.array_equal(
            info.q_sequence, np.arange(len(info.q_sequence))):
        raise ValueError("a permuted q_sequence is not supported by the Mosaic GPU kernel")
    classes = np.asarray(info.block_mask).astype(np.int8)
    mask_next = (np.zeros(classes.shape, np.int32) if info.mask_next is None
                 else np.asarray(info.mask_next).astype(np.int32))
    heads, q_blocks, _ = classes.shape
    kv_block = np.zeros(classes.shape, np.int32)
    kind = np.full(classes.shape, EMPTY, np.int32)
    mask_block = np.zeros(classes.shape, np.int32)
    count = np.zeros((heads, q_blocks), np.int32)
    for h in range(heads):
        for i in range(q_blocks):
            (live,) = np.nonzero(classes[h, i] != EMPTY)
            n = len(live)
            count[h, i] = n
            kv_block[h, i, :n] = live
            kind[h, i, :n] = classes[h, i, live]
            mask_block[h, i, :n] = np.where(classes[h, i, live] == PARTIAL,
                                            mask_next[h, i, live], 0)
    partial = info.partial_mask_blocks
    if partial is None or len(partial) == 0:
        partial = np.zeros((1, block_q, block_kv), bool)
    return BlockPlan(kv_block, kind, mask_block, count, np.asarray(partial, bool), classes,
                     mask_function)
