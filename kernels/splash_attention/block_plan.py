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

Upstream classifies tile by tile, evaluating the mask on each (2.5 M tiles for the nine
variants' build-only points, 47 of a 57 s lowering job). Where every head shares one
causal or local mask, whose visibility depends on q − kv alone, its ``band`` gives
upstream's table from the visibility of each difference: a tile holds every difference
from its smallest to its largest and no other, so it is empty where none is visible and
full where all are; a partial tile is that visibility read along its diagonals (tested
equal to upstream's MaskInfo, tables, tiles and indices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

EMPTY, PARTIAL, FULL = 0, 1, 2  # upstream MaskInfo's block classes
# Upstream masks whose visibility is a function of q − kv alone (their own offset aside).
BAND_MASKS = (mask_lib.CausalMask, mask_lib.LocalMask)


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


class WithoutIndexFunction(mask_lib.Mask):
    """The same mask, minus its index function: MaskInfo then keeps partial tiles.

    Equivalent to ``NumpyMask(mask[:, :])`` without materialising S x S booleans.
    """

    def __init__(self, mask: mask_lib.Mask):
        self.mask = mask

    @property
    def shape(self):
        return self.mask.shape

    def __getitem__(self, index):
        return self.mask[index]

    def __eq__(self, other):
        return isinstance(other, WithoutIndexFunction) and self.mask == other.mask

    def __hash__(self):
        return hash((WithoutIndexFunction, self.mask))


@dataclasses.dataclass(frozen=True)
class Band:
    """A causal or local mask every head shares, seen as the visibility of each q − kv."""

    head: mask_lib.Mask  # the shared mask (unwrapped)
    visible: np.ndarray  # bool [q_len + kv_len - 1]: difference d at d + kv_len - 1
    low: np.ndarray  # int [q_blocks, kv_blocks]: each tile's smallest difference, placed
    tiles: bool  # wrapped in WithoutIndexFunction: partial tiles loaded, not computed
    block_q: int
    block_kv: int

    def classes(self) -> np.ndarray:
        """Upstream's class table, [1, q_blocks, kv_blocks] int8: a tile holds every
        difference from its smallest to its largest, and no other."""
        block_q, block_kv = self.block_q, self.block_kv
        seen = np.concatenate([[0], np.cumsum(self.visible)])
        count = seen[self.low + block_q + block_kv - 1] - seen[self.low]
        table = np.where(count == 0, EMPTY,
                         np.where(count == block_q + block_kv - 1, FULL, PARTIAL))
        return table[None].astype(np.int8)

    def partial_tiles(self, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Upstream's mask_next (int32, each partial tile's index) and its distinct
        partial tiles ([n, block_q, block_kv] bool, in order of first appearance row by
        row, None without one)."""
        mask_next = np.zeros(classes.shape, np.int32)
        ids: dict[bytes, int] = {}
        tiles = []
        block_q, block_kv = self.block_q, self.block_kv
        offsets = np.arange(block_q)[:, None] + (block_kv - 1 - np.arange(block_kv))[None, :]
        for i, j in zip(*np.nonzero(classes[0] == PARTIAL), strict=True):
            tile = self.visible[self.low[i, j] + offsets]
            key = tile.tobytes()
            if key not in ids:
                ids[key] = len(tiles)
                tiles.append(tile)
            mask_next[0, i, j] = ids[key]
        return mask_next, (np.stack(tiles) if tiles else None)


def band(mask: mask_lib.MultiHeadMask, block_q: int, block_kv: int) -> Band | None:
    """``mask`` as a ``Band`` where every head shares one causal or local mask
    (``BAND_MASKS``, bare or in ``WithoutIndexFunction``), its visibility evaluated by
    the mask's own function; None for any other mask (upstream classifies it). Block
    sizes that do not divide the sequences raise, as upstream's do."""
    if not isinstance(mask, mask_lib.MultiHeadMask) or len(mask.shape) != 3:
        raise ValueError(f"expected a MultiHeadMask of 3 dimensions, got {mask!r}")
    first = mask.masks[0]
    tiles = isinstance(first, WithoutIndexFunction)
    head = first.mask if tiles else first
    if type(head) not in BAND_MASKS or any(m != first for m in mask.masks[1:]):
        return None
    q_len, kv_len = head.shape
    for name, size, length in (("block_q", block_q, q_len), ("block_kv", block_kv, kv_len)):
        if size <= 0 or length % size:
            raise ValueError(f"{name}={size} should divide the sequence length {length}")
    if not np.array_equal(head.q_sequence, np.arange(q_len)):
        raise ValueError("a permuted q_sequence is not supported by the Mosaic GPU kernel")
    d = np.arange(-(kv_len - 1), q_len)  # evaluated on one real (q, kv) pair each
    visible = np.asarray(head.mask_function(np.maximum(d, 0)[:, None],
                                            np.maximum(-d, 0)[:, None]), bool)[:, 0]
    q0 = np.arange(q_len // block_q)[:, None] * block_q
    kv0 = np.arange(kv_len // block_kv)[None, :] * block_kv
    return Band(head, visible, q0 - (kv0 + block_kv - 1) + kv_len - 1, tiles, block_q,
                block_kv)


def _classified(mask: mask_lib.MultiHeadMask, block_q: int, block_kv: int, dkv: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, Callable | None]:
    """Upstream's class table, mask_next (int32), partial tiles (None where the mask
    function serves; [block_kv, block_q] for dkv) and mask function for ``mask`` at these
    blocks: from its ``band`` where it has one, else from upstream's MaskInfo."""
    found = band(mask, block_q, block_kv)
    if found is not None:
        classes = found.classes()
        if not found.tiles:
            return classes, np.zeros(classes.shape, np.int32), None, found.head.mask_function
        mask_next, partial = found.partial_tiles(classes)
        if dkv and partial is not None:
            partial = np.swapaxes(partial, -1, -2)
        return classes, mask_next, partial, None
    process = (splash_attention_mask_info.process_mask_dkv if dkv
               else splash_attention_mask_info.process_mask)
    info, mask_function = process(mask, (block_q, block_kv), downcast_smem_data=False,
                                  shrink_grid=False)
    if info.q_sequence is not None and not np.array_equal(
            info.q_sequence, np.arange(len(info.q_sequence))):
        raise ValueError("a permuted q_sequence is not supported by the Mosaic GPU kernel")
    classes = np.asarray(info.block_mask).astype(np.int8)
    mask_next = (np.zeros(classes.shape, np.int32) if info.mask_next is None
                 else np.asarray(info.mask_next).astype(np.int32))
    return classes, mask_next, info.partial_mask_blocks, mask_function


def plan(mask: mask_lib.MultiHeadMask, block_q: int, block_kv: int) -> BlockPlan:
    """Classify ``mask`` as upstream's MaskInfo does and compact it for the kernel."""
    classes, mask_next, partial, mask_function = _classified(mask, block_q, block_kv, False)
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
    """Classify ``mask`` as upstream's dkv MaskInfo does; one walk per (kv head, kv block)."""
    # classes: [mask_heads, q_blocks, kv_blocks]
    classes, mask_next, partial, mask_function = _classified(mask, block_q, block_kv, True)
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
    if partial is None or len(partial) == 0:
        partial = np.zeros((1, block_kv, block_q), bool)
    return DkvPlan(head_offset, q_block, kind, mask_block, count, np.asarray(partial, bool),
                   classes, mask_function)
