"""The float64 oracle: dense masked multi-head attention in numpy."""

from __future__ import annotations

import numpy as np


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, *,
              segment_ids: tuple[np.ndarray, np.ndarray] | None = None,
              soft_cap: float | None = None, return_lse: bool = False):
    """softmax(cap(q kᵀ), masked) v in float64.

    q [Hq,Sq,Dqk], k [Hkv,Skv,Dqk], v [Hkv,Skv,Dv] with Hq % Hkv == 0; ``mask`` bool
    [Sq,Skv] or [Hq,Sq,Skv], True where a query may attend; ``segment_ids`` (q [Sq],
    kv [Skv]) keep only pairs in the same segment; ``soft_cap`` applies
    ``cap·tanh(x/cap)`` to the logits before masking. As splash attention, no 1/sqrt(D)
    scaling is applied inside. A row that sees no key gives 0 (and logsumexp -inf).
    Returns out [Hq,Sq,Dv], and logsumexp [Hq,Sq] when ``return_lse``.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    logits = np.einsum("hqd,hkd->hqk", q, k)
    if soft_cap is not None:
        logits = soft_cap * np.tanh(logits / soft_cap)
    visible = np.broadcast_to(np.asarray(mask, bool), logits.shape)
    if segment_ids is not None:
        q_seg, kv_seg = (np.asarray(s) for s in segment_ids)
        visible = visible & (q_seg[:, None] == kv_seg[None, :])
    logits = np.where(visible, logits, -np.inf)
    seen = visible.any(axis=-1, keepdims=True)
    peak = np.where(seen, logits.max(axis=-1, keepdims=True, initial=-np.inf), 0.0)
    weights = np.exp(logits - peak)
    total = weights.sum(axis=-1, keepdims=True)
    out = np.einsum("hqk,hkd->hqd", weights / np.where(seen, total, 1.0), v)
    if not return_lse:
        return out
    with np.errstate(divide="ignore"):
        lse = np.where(seen, peak + np.log(np.where(seen, total, 1.0)), -np.inf)[..., 0]
    return out, lse
