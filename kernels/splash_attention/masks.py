"""Dense boolean masks of a point (numpy only): what the oracle and baselines apply."""

from __future__ import annotations

from typing import Any

import numpy as np


def dense_mask(params: dict[str, Any]) -> np.ndarray:
    """``[S, S]`` bool: True where query i may attend to key j."""
    n = params["seq_len"]
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    mask = params["mask"]
    if mask["kind"] == "causal":
        return k <= q
    left, right = mask["window"]
    return (k >= q - left) & (k <= q + right)


def segment_ids(params: dict[str, Any]) -> np.ndarray | None:
    """``[S]`` int32 ids of ``params["segments"]`` equal packed sequences, or None."""
    count = params.get("segments")
    if not count:
        return None
    return (np.arange(params["seq_len"]) * count // params["seq_len"]).astype(np.int32)


def visible(params: dict[str, Any]) -> np.ndarray:
    """``[S, S]`` bool: the mask, and the same segment when the point packs sequences."""
    ids = segment_ids(params)
    mask = dense_mask(params)
    return mask if ids is None else mask & (ids[:, None] == ids[None, :])


def visible_range(params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)``, each ``[S]`` int64: query i sees exactly the keys low[i]..high[i]
    (the mask and its segment intersected; an empty row has high < low), without the
    [S, S] array."""
    n = params["seq_len"]
    q = np.arange(n)
    if params["mask"]["kind"] == "causal":
        low, high = np.zeros(n, np.int64), q
    else:
        left, right = params["mask"]["window"]
        low, high = np.maximum(q - left, 0), np.minimum(q + right, n - 1)
    ids = segment_ids(params)
    if ids is not None:
        starts = np.searchsorted(ids, ids, side="left")
        ends = np.searchsorted(ids, ids, side="right") - 1
        low, high = np.maximum(low, starts), np.minimum(high, ends)
    return low.astype(np.int64), high.astype(np.int64)


def visible_count(params: dict[str, Any]) -> int:
    """The number of True entries of ``visible(params)``, row by row without the [S, S]
    array (``visible_range``)."""
    low, high = visible_range(params)
    return int(np.maximum(high - low + 1, 0).sum())
