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


@dataclasses.dataclass(frozen=True)
class DkvPlan:
    """The dK/dV kernel's walk, from upstream's dkv MaskInfo (``process_mask_dkv``).

    One CTA owns one (kv head, kv block) and accumulates dK, dV over every query head
    of its group and every non-empty q block: step ``u`` visits query head
    ``kv_head * group + head_offset[p, j, u]``, q block ``q_block[p, j, u]``, of class
    ``kind[p, j, u]`` (partial: tile ``mask_block[p, j, u]`` of ``partial_blocks``,
    stored transposed as [block_kv, block_q] by upstream). ``count[p, j]`` steps in all.
    ``p`` is the kv head when heads have their own masks, else 0 (shared).
    """

    head_offset: np.ndarray  # int32 [plan_heads, kv_blocks, group * q_blocks]
    q_block: np.ndarray
    kind: np.ndarray
    mask_block: np.ndarray
    count: np.ndarray  # int32 [plan_heads, kv_blocks]
    partial_blocks: np.ndarray  # bool [max(1, partial tiles), block_kv, block_q]
    classes: np.ndarray  # int8 [mask_heads, q_blocks, kv_blocks]: upstream's dkv table
    mask_function: Callable | None

    @property
    def plan_heads(self) -> int:
        return int(self.count.shape[0])


def plan_dkv(mask: mask_lib.MultiHeadMask, block_q: int, block_kv: int,
             heads_kv: int) -> DkvPlan:
    """Classify ``mask`` with upstream's dkv MaskInfo; one walk per (kv head, kv block)."""
    info, mask_function = splash_attention_mask_info.process_mask_dkv(
        mask, (block_q, block_kv), downcast_smem_data=False, shrink_grid=False)
    if info.q_sequence is not None and not np.array_equal(
            info.q_sequence, np.arange(len(info.q_sequence))):
        raise ValueError("a permuted q_sequence is not supported by the Mosaic GPU kernel")
    classes = np.asarray(info.block_mask).astype(np.int8)  # [mask_heads, q_blocks, kv_blocks]
    mask_next = (np.zeros(classes.shape, np.int32) if info.mask_next is None
                 else np.asarray(info.mask_next).astype(np.int32))
    mask_heads, q_blocks, kv_blocks = classes.shape
    heads_q = len(mask.masks)
    group = heads_q // heads_kv
    per_head = mask_heads > 1
    plan_heads = heads_kv if per_head else 1
    shape = (plan_heads, kv_blocks, group * q_blocks)
    head_offset, q_block, mask_block = (np.zeros(shape, np.int32) for _ in range(3))
    kind = np.full(shape, EMPTY, np.int32)
    count = np.zeros((plan_heads, kv_blocks), np.int32)
    for p in range(plan_heads):
        for j in range(kv_blocks):
            u = 0
            for g in range(group):
                h = p * group + g if per_head else 0
                (live,) = np.nonzero(classes[h, :, j] != EMPTY)
                n = len(live)
                head_offset[p, j, u:u + n] = g
                q_block[p, j, u:u + n] = live
                kind[p, j, u:u + n] = classes[h, live, j]
                mask_block[p, j, u:u + n] = np.where(classes[h, live, j] == PARTIAL,
                                                     mask_next[h, live, j], 0)
                u += n
            count[p, j] = u
    partial = info.partial_mask_blocks
    if partial is None or len(partial) == 0:
        partial = np.zeros((1, block_kv, block_q), bool)
    return DkvPlan(head_offset, q_block, kind, mask_block, count, np.asarray(partial, bool),
                   classes, mask_function)
