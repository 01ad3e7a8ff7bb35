"""The float64 oracle at any sequence length: chosen rows exactly, in chunks.

The dense oracle (``oracle_f64``, ``oracle_vjp``) holds [H, S, S] arrays: at S 32768 that
is far past any host's memory. This one answers the rows a check samples, each from the
operands alone, in float64:

- a query row (h, i): ``out``, ``lse`` and ``dq`` need only the keys row i sees
  (``masks.visible_range``): O(S·d) each;
- a key row (g, j) of kv head g: ``dk`` and ``dv`` sum over every query that sees key j, in
  every query head of g's group, and need each such query's statistics: its logsumexp and
  D_i = do_i·out_i. ``statistics`` computes them exactly for the query heads of the kv
  heads sampled, a chunk of queries at a time (O(S²·d) work a head, O(chunk·S) memory);
  ``sample`` draws key rows from KEY_HEADS kv heads so that a check stays affordable at
  S 32768.

Conventions as the dense oracle's: no 1/sqrt(d) inside, soft cap c·tanh(x/c) before the
mask, a row that sees no key gives out 0, lse -inf and dq 0; dk and dv of a key no query
sees are 0. Gradients: dS = P ∘ (do·vᵀ − D), times the cap's derivative 1 − (s/c)²;
dq = dS k, dk = dSᵀ q, dv = Pᵀ do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.splash_attention import masks

CHUNK = 256  # queries per block of ``statistics``: 256 × S float64 logits at a time
# kv heads a check's key rows come from: their groups' statistics cost O(S²·d) a query head
# (about 2.5 s a head at S 32768, causal, d 128, on 13 cores), the query rows none.
KEY_HEADS = 4


def _operands(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    q, k, v, do = (np.asarray(inputs[n], np.float64) for n in ("q", "k", "v", "do"))
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or do.shape[:2] != q.shape[:2]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}, do {do.shape}: needs "
                         "q, do [Hq, S, d] and k, v [Hkv, S, d]")
    if q.shape[0] % k.shape[0] or k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2] \
            or do.shape[2] != v.shape[2] or q.shape[1] != k.shape[1]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}, do {do.shape}: heads of q "
                         "a multiple of k's, k and v alike, q·k and do·v of equal depth")
    return q, k, v, do


def _logits(q_rows: np.ndarray, keys: np.ndarray, cap: float | None
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """Capped logits of ``q_rows`` against ``keys``, and the cap's derivative (None: no
    cap)."""
    raw = q_rows @ keys.T
    if cap is None:
        return raw, None
    capped = cap * np.tanh(raw / cap)
    return capped, 1 - (capped / cap) ** 2


def _softmax(logits: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of probabilities over ``seen`` entries, and each row's logsumexp (-inf where
    it sees nothing)."""
    masked = np.where(seen, logits, -np.inf)
    any_seen = seen.any(axis=-1)
    peak = np.where(any_seen, masked.max(axis=-1, initial=-np.inf), 0.0)
    weights = np.where(seen, np.exp(masked - peak[:, None]), 0.0)
    total = weights.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.where(any_seen, peak + np.log(np.where(any_seen, total, 1.0)), -np.inf)
    return weights / np.where(any_seen, total, 1.0)[:, None], lse


def query_rows(params: dict[str, Any], inputs: dict[str, np.ndarray], heads: np.ndarray,
               rows: np.ndarray) -> dict[str, np.ndarray]:
    """``out`` [n, dv], ``lse`` [n] and ``dq`` [n, d] of the query rows (heads[m], rows[m])."""
    q, k, v, do = _operands(inputs)
    low, high = masks.visible_range(params)
    cap, group = params.get("soft_cap"), q.shape[0] // k.shape[0]
    out = np.zeros((len(rows), v.shape[2]))
    lse = np.full(len(rows), -np.inf)
    dq = np.zeros((len(rows), q.shape[2]))
    for m, (h, i) in enumerate(zip(heads, rows, strict=True)):
        if high[i] < low[i]:
            continue
        g, keys = h // group, slice(low[i], high[i] + 1)
        logits, slope = _logits(q[h, i][None], k[g, keys], cap)
        p, row_lse = _softmax(logits, np.ones_like(logits, bool))
        out[m], lse[m] = (p @ v[g, keys])[0], row_lse[0]
        ds = p * (do[h, i] @ v[g, keys].T - do[h, i] @ out[m])
        dq[m] = ((ds if slope is None else ds * slope) @ k[g, keys])[0]
    return {"out": out, "lse": lse, "dq": dq}


def statistics(params: dict[str, Any], inputs: dict[str, np.ndarray], chunk: int = CHUNK,
               kv_heads: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``lse`` and D = rowsum(do ∘ out), each [Hq, S], of every query row of the query
    heads of ``kv_heads`` (default all: the others' rows are left -inf and 0), a chunk of
    queries at a time."""
    q, k, v, do = _operands(inputs)
    low, high = masks.visible_range(params)
    cap, group = params.get("soft_cap"), q.shape[0] // k.shape[0]
    n = q.shape[1]
    groups = range(k.shape[0]) if kv_heads is None else sorted(set(np.asarray(kv_heads).tolist()))
    heads = [h for g in groups for h in range(g * group, (g + 1) * group)]
    lse, delta = np.full(q.shape[:2], -np.inf), np.zeros(q.shape[:2])
    for start in range(0, n, chunk):
        rows = np.arange(start, min(start + chunk, n))
        first, last = low[rows].min(), high[rows].max()
        if last < first:
            continue
        keys = np.arange(first, last + 1)
        seen = (keys[None] >= low[rows, None]) & (keys[None] <= high[rows, None])
        for h in heads:
            logits, _ = _logits(q[h, rows], k[h // group, first:last + 1], cap)
            p, lse[h, rows] = _softmax(logits, seen)
            delta[h, rows] = np.einsum("rd,rd->r", p @ v[h // group, first:last + 1],
                                       do[h, rows])
    return lse, delta


def key_rows(params: dict[str, Any], inputs: dict[str, np.ndarray],
             stats: tuple[np.ndarray, np.ndarray], kv_heads: np.ndarray, keys: np.ndarray
             ) -> dict[str, np.ndarray]:
    """``dk`` [n, d] and ``dv`` [n, dv] of the key rows (kv_heads[m], keys[m]), from every
    query row's ``statistics``."""
    q, k, v, do = _operands(inputs)
    low, high = masks.visible_range(params)
    lse, delta = stats
    cap, group = params.get("soft_cap"), q.shape[0] // k.shape[0]
    dk, dv = np.zeros((len(keys), k.shape[2])), np.zeros((len(keys), v.shape[2]))
    for m, (g, j) in enumerate(zip(kv_heads, keys, strict=True)):
        seeing = np.flatnonzero((low <= j) & (high >= j))
        for h in range(g * group, (g + 1) * group):
            logits, slope = _logits(q[h, seeing], k[g, j][None], cap)
            p = np.exp(logits[:, 0] - lse[h, seeing])
            dv[m] += p @ do[h, seeing]
            ds = p * (do[h, seeing] @ v[g, j] - delta[h, seeing])
            dk[m] += (ds if slope is None else ds * slope[:, 0]) @ q[h, seeing]
    return {"dk": dk, "dv": dv}


def sample(params: dict[str, Any], rng: np.random.Generator, count: int,
           key_heads: int = KEY_HEADS) -> dict[str, np.ndarray]:
    """``count`` distinct (query head, query row) pairs of any head, and as many distinct
    (kv head, key row) pairs of ``key_heads`` kv heads drawn first (all where there are
    fewer), all from ``rng``: a key row's answer needs its group's ``statistics``, whose
    cost grows with the heads sampled."""
    n = params["seq_len"]

    def pairs(heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        chosen = rng.choice(len(heads) * n, size=min(count, len(heads) * n), replace=False)
        chosen.sort()
        return heads[chosen // n], chosen % n

    groups = np.sort(rng.choice(params["heads_kv"], size=min(key_heads, params["heads_kv"]),
                                replace=False))
    (qh, qi), (kh, kj) = pairs(np.arange(params["heads_q"])), pairs(groups)
    return {"query_heads": qh, "query_rows": qi, "kv_heads": kh, "key_rows": kj}
