"""Small splash attention problems for checking the port (numpy and upstream masks only):
every upstream mask type, random inputs, packed-sequence segment ids.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

DTYPE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# logsumexp (the backward's residual, no case output) is computed in f32 from f32
# logits: upstream's tolerance for it, absolute and relative.
LSE_TOLERANCE = 1e-3
S = 256  # small enough for the interpreter, four 64-row q blocks
MASK_KINDS = ("causal", "causal_offset", "local", "chunked", "full", "numpy", "combined",
              "per_head")

# One problem per mask kind, across head layouts, unequal dims and both dtypes:
# (mask, heads_q, heads_kv, dqk, dv, dtype).
MASK_CASES = [
    ("causal", 2, 2, 64, 64, "float16"),
    ("causal_offset", 2, 1, 64, 64, "bfloat16"),
    ("local", 4, 2, 64, 64, "bfloat16"),
    ("chunked", 2, 2, 64, 128, "float16"),
    ("full", 1, 1, 128, 64, "bfloat16"),
    ("numpy", 2, 2, 64, 64, "float16"),
    ("combined", 2, 1, 64, 64, "bfloat16"),
    ("per_head", 4, 2, 64, 64, "float16"),
]
MASK_CASE_IDS = [f"{c[0]}-h{c[1]}x{c[2]}-d{c[3]}x{c[4]}-{c[5]}" for c in MASK_CASES]

def mask_of(kind: str, heads: int, rng: np.random.Generator, s: int = S):
    """An upstream MultiHeadMask of ``kind`` for ``heads`` query heads."""
    shape = (s, s)
    if kind == "causal":
        return splash.MultiHeadMask([splash.CausalMask(shape)] * heads)
    if kind == "causal_offset":
        return splash.MultiHeadMask([splash.CausalMask(shape, offset=40)] * heads)
    if kind == "local":
        return splash.MultiHeadMask([splash.LocalMask(shape, (70, 10), offset=0)] * heads)
    if kind == "chunked":
        return splash.MultiHeadMask([mask_lib.ChunkedCausalMask(shape, 96)] * heads)
    if kind == "full":
        return splash.MultiHeadMask([splash.FullMask(shape)] * heads)
    if kind == "numpy":
        visible = (rng.random(shape) < 0.3) | np.eye(s, dtype=bool)
        return splash.MultiHeadMask([splash.NumpyMask(visible)] * heads)
    if kind == "combined":  # (causal & local) | a sink column block: & and | of masks
        sink = np.zeros(shape, bool)
        sink[:, :16] = True
        both = (splash.CausalMask(shape) & splash.LocalMask(shape, (50, 0), offset=0)) \
            | splash.NumpyMask(sink)
        return splash.MultiHeadMask([both] * heads)
    if kind == "per_head":
        return splash.MultiHeadMask([splash.CausalMask(shape) if h % 2 else
                                     splash.LocalMask(shape, (30, 30), offset=0)
                                     for h in range(heads)])
    raise ValueError(kind)


def dense(mask) -> np.ndarray:
    return np.stack([m[:, :] for m in mask.masks])


def inputs(rng, hq, hkv, dqk, dv, dtype, s=S):
    dt = DTYPE[dtype]
    q = (rng.standard_normal((hq, s, dqk)) / np.sqrt(dqk)).astype(dt)
    k = rng.standard_normal((hkv, s, dqk)).astype(dt)
    v = rng.standard_normal((hkv, s, dv)).astype(dt)
    return q, k, v


def segments(rng, s=S):
    """Sorted segment ids (packed sequences), the same for q and kv."""
    cuts = np.sort(rng.choice(np.arange(1, s), size=3, replace=False))
    ids = np.zeros(s, np.int32)
    for c in cuts:
        ids[c:] += 1
    return splash.SegmentIds(q=ids, kv=ids)
