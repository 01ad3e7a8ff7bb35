"""The float64 oracle: dense masked multi-head attention in numpy."""

from __future__ import annotations

import numpy as np


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """softmax(q kᵀ, masked) v in float64; q [Hq,S,D], k/v [Hkv,S,D], Hq % Hkv == 0.

    Like splash attention, no 1/sqrt(D) scaling is applied inside. Rows with no visible
    key would be undefined; the masks used here always keep the diagonal.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    logits = np.einsum("hqd,hkd->hqk", q, k)
    logits = np.where(mask, logits, -np.inf)
    logits -= logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,hkd->hqd", weights, v)
