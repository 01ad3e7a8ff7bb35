"""Per-element error bounds of a correct attention forward, from the operands (numpy only).

What any correct execution may differ from the float64 answer by, element by element,
derived from the actual q, k, v, the mask and the soft cap (docs/splash-bounds.md has the
derivation). Executions covered: one that computes the logits q·kᵀ in float32 (any order),
applies the cap and the softmax in float32 (online, block by block, or whole rows), rounds
the probabilities to v's dtype before P·V (normalised first, or normalised after by an
unrounded float32 sum) and accumulates P·V in float32. A row's terms:

- ``e_j``, the logit's error: γ_d Σ_d |q_d k_jd| (float32 dot over d), through the cap's
  slope, plus the cap's tanh and the max's subtraction in float32 (EXP each, relative);
- ``T1 = Σ_j P_j η_j |v_j − out|``: the weights perturbed by η_j = 1.01 (e_j + 2 EXP)
  (a relative weight error moves out by its share of v_j − out);
- ``T2 = u_P Σ_j P_j (|v_j| + |out|) + s_P Σ_j |v_j|``: P rounded to v's dtype
  (relative u_P, whether or not the normaliser saw the rounded P) and the dtype's smallest
  normal (or half subnormal step) for a weight that underflows;
- ``T3 = γ_{2n+2} (Σ_j P_j |v_j| + |out|)``: the float32 sums of P·V and of the
  normaliser over n visible keys, the online rescalings and the final division.

The worst case is (T1 + T2 + T3)(1 + u_out), to which the output's own rounding
u_out |out| is added by the case's rtol. It does not fall with S, while an error in 64
keys of a row does: for v drawn as the case draws it (``v_sigma``), out's bound is the
smaller of it and the **bound over v** (``_over_v``): the same terms with each sum of
errors that is linear in v, given q and k, taken at λσ√(Σ c_j²) instead of Σ c_j |v_j|,
true but with probability under 10⁻²¹ an element (docs/splash-bounds.md). Rows are
computed a chunk at a time: the bound serves the dense check and the sampled rows at
any sequence length alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

F32 = 2.0**-24  # float32 unit roundoff
# float32 exp and tanh on any backend, their argument's rounding included: 16 ulp,
# relative (TPU and GPU approximations are within a few).
EXP = 16 * F32
UNIT = {"float32": F32, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# What a weight that underflows in the dtype can lose, absolutely: bfloat16 and float32
# flush to zero below their smallest normal on a TPU; float16 keeps subnormals (half a
# step of 2⁻²⁴).
UNDERFLOW = {"float32": 2.0**-126, "bfloat16": 2.0**-126, "float16": 2.0**-25}
CHUNK = 256  # query rows at a time
# The bound over v (docs/splash-bounds.md): a tail bound of v's draw, λ·σ·√(Σ c²), each
# element past it with probability under (2n + 3)·2e^(−λ²/2) (10⁻²¹ at S 32768).
LAMBDA = 11.0
SIGMA = 1.01  # a standard normal rounded to the dtype: |round(x)| ≤ (1 + u)|x|, with room
SAMPLED = 2**20  # v's entries ``v_sigma`` reads at most


def real(xp: Any) -> Any:
    """The dtype a bound is evaluated in: float64 in numpy; float32 in jax.numpy, whose
    default is 32-bit (``oracle_f32`` allows for it)."""
    return np.float64 if xp is np else np.float32


def gamma(n: np.ndarray | int, xp: Any = np) -> np.ndarray:
    """γ_n = n u / (1 − n u) of float32: the relative error of an n-term float32 sum."""
    n = xp.asarray(n, real(xp))
    return n * F32 / (1 - n * F32)


def v_sigma(v: Any) -> float | None:
    """SIGMA where ``v`` is drawn as the case draws it, independent standard normals (its
    mean and mean square, over at most SAMPLED evenly spaced entries, within 6 standard
    errors of 0 and 1, its rounding allowed), else None: the bound over v does not hold
    for it, and the worst case alone applies."""
    flat = np.asarray(v).reshape(-1)
    x = flat[::max(1, flat.size // SAMPLED)].astype(np.float32)
    n = x.size
    if n == 0:
        return None
    mean, square = x.mean(dtype=np.float64), np.square(x).mean(dtype=np.float64)
    drawn = abs(mean) <= 6 / np.sqrt(n) and abs(square - 1) <= 6 * np.sqrt(2 / n) + 2**-7
    return SIGMA if drawn else None


def _over_v(p: Any, eta: Any, seen: Any, out: Any, p_v: Any, mag: Any, dtype: str,
            sigma: float, xp: Any) -> Any:
    """Each element's bound over v's draw (docs/splash-bounds.md): the weights' errors
    (θ_j = η_j + u_P, fixed by q and k) move out by Σ_j P_j θ_j (v_j − out), whose part in
    v is within λσ√(Σ_j (P_j θ_j)²); each rounding of the float32 sums is u times a
    partial sum of v within λσ√(Σ_j P_j²) (2n + 2 of them; 3n + 2 where float32 products
    round too); the normaliser, the partial sums' own errors and the underflows worst
    case; all over 1 − max θ (the weights as computed)."""
    theta = xp.where(seen, eta + UNIT[dtype], 0.0)
    weight = theta * p
    tail = LAMBDA * sigma
    n = seen.sum(axis=1)
    moved = tail * xp.sqrt((weight**2).sum(axis=1))[:, None] \
        + xp.abs(out) * weight.sum(axis=1)[:, None]
    rounded = gamma(2 * n + 2 + (n if dtype == "float32" else 0), xp)[:, None]
    sums = rounded * (tail * xp.sqrt((p**2).sum(axis=1))[:, None] + xp.abs(out)
                      + rounded * p_v)
    scale = 1 / (1 - xp.max(theta, axis=1, initial=0.0)[:, None])
    return ((moved + sums) * scale + UNDERFLOW[dtype] * (seen @ mag)) * (1 + UNIT[dtype])


def forward_terms(q_rows: np.ndarray, keys: np.ndarray, values: np.ndarray, seen: np.ndarray,
             cap: float | None, dtype: str, xp: Any = np, sigma: float | None = None
             ) -> dict[str, np.ndarray]:
    """The forward of some query rows with every term its bound needs, in float64 (or in
    float32 where ``xp`` is jax.numpy: ``oracle_f32``). ``bound``: the worst case, or
    where ``sigma`` is given (``v_sigma``) the smaller of it and the bound over v;
    ``worst_bound``: the worst case."""
    q_rows, keys, values = (xp.asarray(x, real(xp)) for x in (q_rows, keys, values))
    raw = q_rows @ keys.T
    error = gamma(q_rows.shape[1], xp) * (xp.abs(q_rows) @ xp.abs(keys).T)
    if cap is None:
        logits, slope = raw, xp.ones_like(raw)
    else:
        logits = cap * xp.tanh(raw / cap)
        slope = 1 - (logits / cap) ** 2
        error = error * slope + EXP * xp.abs(logits)
    masked = xp.where(seen, logits, -xp.inf)
    any_seen = seen.any(axis=1)
    peak = xp.where(any_seen, xp.max(masked, axis=1, initial=-xp.inf), 0.0)
    weights = xp.where(seen, xp.exp(masked - peak[:, None]), 0.0)
    total = xp.where(any_seen, weights.sum(axis=1), 1.0)
    p = weights / total[:, None]
    out = p @ values
    mag = xp.abs(values)
    p_v = p @ mag
    eta = xp.where(seen, 1.01 * (error + EXP * xp.abs(logits - peak[:, None]) + 2 * EXP), 0.0)
    worst = xp.max(eta, axis=1, initial=0.0)[:, None]
    # Σ_j P_j η_j |v_j − out| ≤ Σ_j P_j η_j |v_j| + |out| Σ_j P_j η_j
    t1 = ((p * eta) @ mag + xp.abs(out) * (p * eta).sum(axis=1)[:, None]) / (1 - worst)
    t2 = UNIT[dtype] * (p_v + xp.abs(out)) + UNDERFLOW[dtype] * (seen @ mag)
    sums = gamma(2 * seen.sum(axis=1) + 2, xp)
    t3 = sums[:, None] * (p_v + xp.abs(out))
    worst_bound = xp.where(any_seen[:, None], (t1 + t2 + t3) * (1 + UNIT[dtype]), 0.0) \
        + UNDERFLOW[dtype]
    bound = worst_bound if sigma is None else xp.minimum(worst_bound, xp.where(
        any_seen[:, None], _over_v(p, eta, seen, out, p_v, mag, dtype, sigma, xp), 0.0)
        + UNDERFLOW[dtype])
    lse = xp.where(any_seen, peak + xp.log(total), -xp.inf)  # total is 1 where unseen
    # The forward's logsumexp: its weights (η), its sum and rescalings, its log.
    lse_error = 1.01 * ((p * eta).sum(axis=1) + sums + F32 * xp.abs(xp.where(
        any_seen, lse, 0.0)) + EXP)
    return {"logits": logits, "error": error, "slope": slope, "p": p, "out": out,
            "eta": eta, "bound": bound, "worst_bound": worst_bound, "lse": lse,
            "lse_error": lse_error, "any_seen": any_seen}


def forward_rows(q_rows: np.ndarray, keys: np.ndarray, values: np.ndarray,
                 seen: np.ndarray, cap: float | None, dtype: str, xp: Any = np,
                 sigma: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``out`` [n, dv] of ``q_rows`` [n, d] against ``keys`` [m, d] and ``values``
    [m, dv] where ``seen`` [n, m], in float64, and each element's bound before the
    output's rounding (module docstring; ``sigma``: ``forward_terms``). A row that sees
    nothing: out 0, bound 0."""
    found = forward_terms(q_rows, keys, values, seen, cap, dtype, xp, sigma)
    return found["out"], found["bound"]


def backward_rows(q_rows: np.ndarray, do_rows: np.ndarray, keys: np.ndarray,
                  values: np.ndarray, seen: np.ndarray, cap: float | None, dtype: str,
                  xp: Any = np, cap_gradient: bool = True, sigma: float | None = None
                  ) -> dict[str, np.ndarray]:
    """The gradient terms of some query rows (docs/splash-bounds.md): ``dq`` and its
    bound [n, d], and per (row, key) what dk and dv gather over rows: ``ds`` and ``p``
    (their exact weights), ``ds_weight`` and ``p_weight`` (their error weights: the
    error of dS or P as computed, its rounding to the dtype, an underflow), so that
    dk_j = Σ_i ds_ij q_i within Σ_i ds_weight_ij |q_i| + γ Σ_i |ds_ij| |q_i|.
    ``cap_gradient=False`` (a near miss's gradients, not a bound's): dS without the cap's
    derivative. ``out_bound`` as ``forward_rows``'s for ``sigma``; the gradients' terms
    take the forward's worst case."""
    f = forward_terms(q_rows, keys, values, seen, cap, dtype, xp, sigma)
    q_rows, do_rows, keys, values = (xp.asarray(x, real(xp))
                                     for x in (q_rows, do_rows, keys, values))
    unit, under = UNIT[dtype], UNDERFLOW[dtype]
    p, logits, error = f["p"], f["logits"], f["error"]
    lse = xp.where(f["any_seen"], f["lse"], 0.0)
    # P recomputed from the forward's logsumexp: the logit's error, the logsumexp's, the
    # subtraction and the exp.
    rho = xp.where(seen, 1.01 * (error + f["lse_error"][:, None]
                                 + F32 * xp.abs(logits - lse[:, None]) + EXP), 0.0)
    mag_do = xp.abs(do_rows)
    # D = do · out from the forward's rounded output, summed in float32.
    delta = xp.einsum("nc,nc->n", do_rows, f["out"])
    out_error = (f["worst_bound"] + unit * xp.abs(f["out"])) * (1 + unit)
    delta_error = (xp.einsum("nc,nc->n", mag_do, out_error)
                   + gamma(do_rows.shape[1] + 1, xp) * xp.einsum("nc,nc->n", mag_do,
                                                              xp.abs(f["out"])))
    dp = do_rows @ values.T
    dp_error = gamma(do_rows.shape[1], xp) * (mag_do @ xp.abs(values).T)
    slope = f["slope"]
    slope_error = 0.0 if cap is None else (2 * xp.abs(logits) * error / cap**2
                                            + (error / cap) ** 2 + 3 * F32)
    centred = dp - delta[:, None]
    ds = xp.where(seen, p * centred * (slope if cap_gradient else 1.0), 0.0)
    ds_error = xp.where(seen, 1.01 * (xp.abs(ds) * (rho + 5 * F32)
                                      + p * xp.abs(slope) * (dp_error + delta_error[:, None])
                                      + p * xp.abs(centred) * slope_error), 0.0)
    ds_weight = xp.where(seen, ds_error * (1 + unit) + unit * xp.abs(ds) + under, 0.0)
    p_weight = xp.where(seen, p * rho * (1 + unit) + unit * p + under, 0.0)
    mag_k = xp.abs(keys)
    dq = ds @ keys
    sums = gamma(seen.sum(axis=1) + 2, xp)[:, None]
    dq_bound = (ds_weight @ mag_k + sums * (xp.abs(ds) @ mag_k)) * (1 + unit) + under
    # D's error ΔD_i moves a row's dS by −ΔD_i P_ij s_ij (s the cap's slope) and so its dq
    # by −ΔD_i w_i, w_i = Σ_j P_ij s_ij k_j: along one direction a row. dq_free_bound is
    # the rest (ds_error without that term, plus its second order: P̂ŝ's own error),
    # dq_shift the largest |ΔD_i| (docs/splash-bounds.md, "D's direction").
    weight = p * (slope if cap_gradient else 1.0)
    free_error = xp.where(seen, 1.01 * (
        xp.abs(ds) * (rho + 5 * F32) + p * xp.abs(slope) * dp_error
        + p * xp.abs(centred) * slope_error
        + p * delta_error[:, None] * (xp.abs(slope) * rho + slope_error)), 0.0)
    free_weight = xp.where(seen, free_error * (1 + unit) + unit * (xp.abs(ds) + ds_error)
                           + under, 0.0)
    dq_free_bound = (free_weight @ mag_k
                     + sums * ((xp.abs(ds) + ds_error) @ mag_k)) * (1 + unit) + under
    return {"dq": dq, "dq_bound": dq_bound, "ds": ds, "ds_weight": ds_weight, "p": p,
            "p_weight": p_weight, "out": f["out"], "out_bound": f["bound"],
            "dq_free_bound": dq_free_bound, "dq_direction": weight @ keys,
            "dq_shift": 1.01 * delta_error[:, None]}


Visibility = Callable[[int, np.ndarray], "tuple[np.ndarray, np.ndarray] | None"]


def visibility(params: dict[str, Any]) -> Visibility:
    """For query rows of a query head: the span of keys any of them sees and [rows,
    span] which each does (the point's mask and segments, the same for every head,
    without the [S, S] array); None: none sees any."""
    from kernels.splash_attention import masks

    low, high = masks.visible_range(params)
    ids = masks.segment_ids(params)

    def see(head: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        first, last = low[rows].min(), high[rows].max()
        if last < first:
            return None
        span = np.arange(first, last + 1)
        seen = (span[None] >= low[rows, None]) & (span[None] <= high[rows, None])
        if ids is not None:
            seen &= ids[span][None] == ids[rows][:, None]
        return span, seen
    return see


def mask_visibility(visible: np.ndarray) -> Visibility:
    """``visibility`` from a dense mask, [S, S] or one per query head [Hq, S, S]
    (segments already folded in)."""
    visible = np.asarray(visible, bool)

    def see(head: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        mask = visible if visible.ndim == 2 else visible[head]
        cols = np.flatnonzero(mask[rows].any(axis=0))
        if not len(cols):
            return None
        span = np.arange(cols[0], cols[-1] + 1)
        return span, mask[np.ix_(rows, span)]
    return see


def rows_bound(params: dict[str, Any], inputs: dict[str, np.ndarray], heads: np.ndarray,
               rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``out`` and its bound (``forward_rows``), [n, dv] each, at the query rows
    (heads[m], rows[m]) of the point ``params``."""
    return _forward_at(inputs, visibility(params), params.get("soft_cap"), params["dtype"],
                       heads, rows)


def _forward_at(inputs: dict[str, np.ndarray], see: Visibility, cap: float | None,
                dtype: str, heads: np.ndarray, rows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """``rows_bound`` for any visibility: a chunk of rows of one head at a time."""
    q, k, v = (np.asarray(inputs[n]) for n in ("q", "k", "v"))
    group, sigma = q.shape[0] // k.shape[0], v_sigma(v)
    out = np.zeros((len(rows), v.shape[2]))
    bound = np.zeros_like(out)
    for h in np.unique(heads):
        of_head = np.flatnonzero(heads == h)
        for start in range(0, len(of_head), CHUNK):
            at = of_head[start:start + CHUNK]
            visible = see(h, rows[at])
            if visible is None:
                continue
            span, seen = visible
            out[at], bound[at] = forward_rows(q[h, rows[at]], k[h // group, span],
                                              v[h // group, span], seen, cap, dtype,
                                              sigma=sigma)
    return out, bound


def out_bound(params: dict[str, Any], inputs: dict[str, np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray]:
    """``out`` and its bound, [Hq, S, dv] each, at every query row."""
    heads, rows = _every(inputs["q"])
    out, bound = rows_bound(params, inputs, heads, rows)
    shape = (*np.shape(inputs["q"])[:2], out.shape[1])
    return out.reshape(shape), bound.reshape(shape)


def _every(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(head, row) of every row of [H, S, ·] ``x``, head-major."""
    heads, n = np.shape(x)[:2]
    return np.repeat(np.arange(heads), n), np.tile(np.arange(n), heads)


def gradient_bounds(params: dict[str, Any], inputs: dict[str, np.ndarray],
                    queries: tuple[np.ndarray, np.ndarray],
                    keys: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """``dq`` and ``dq_bound`` [n, d] at the query rows (heads, rows) of ``queries``,
    ``dk``, ``dk_bound`` [m, d] and ``dv``, ``dv_bound`` [m, dv] at the key rows
    (kv heads, rows) of ``keys``, in float64. A key row gathers over every query row that
    sees it, in every query head of its group: each of its kv heads costs O(S²·d) (a
    chunk of query rows at a time), a query row O(S·d)."""
    return _gradients_at(inputs, visibility(params), params.get("soft_cap"),
                         params["dtype"], queries, keys)


def _gradients_at(inputs: dict[str, np.ndarray], see: Visibility, cap: float | None,
                  dtype: str, queries: tuple[np.ndarray, np.ndarray],
                  keys: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """``gradient_bounds`` for any visibility."""
    q, k, v, do = (np.asarray(inputs[n]) for n in ("q", "k", "v", "do"))
    group, n = q.shape[0] // k.shape[0], q.shape[1]
    q_at = np.full(q.shape[:2], -1)
    q_at[queries] = np.arange(len(queries[0]))
    k_at = np.full(k.shape[:2], -1)
    k_at[keys] = np.arange(len(keys[0]))
    found = {"dq": np.zeros((len(queries[0]), q.shape[2])),
             "dk": np.zeros((len(keys[0]), k.shape[2])),
             "dv": np.zeros((len(keys[0]), v.shape[2]))}
    along = {name: np.zeros_like(found["dq"][:, :width])
             for name, width in (("dq_bound", None), ("dq_free_bound", None),
                                 ("dq_direction", None), ("dq_shift", 1))}
    gathered = {name: np.zeros_like(found[name[:2]])
                for name in ("dk_weight", "dk_abs", "dv_weight", "dv_abs")}
    count = np.zeros(len(keys[0]))
    for h in range(q.shape[0]):
        g = h // group
        every = bool((k_at[g] >= 0).any())
        rows = np.arange(n) if every else np.flatnonzero(q_at[h] >= 0)
        for start in range(0, len(rows), CHUNK):
            at = rows[start:start + CHUNK]
            visible = see(h, at)
            if visible is None:
                continue
            span, seen = visible
            b = backward_rows(q[h, at], do[h, at], k[g, span], v[g, span], seen, cap, dtype)
            mine = q_at[h, at] >= 0
            found["dq"][q_at[h, at[mine]]] = b["dq"][mine]
            for name, value in along.items():
                value[q_at[h, at[mine]]] = b[name][mine]
            cols = np.flatnonzero(k_at[g, span] >= 0)
            if not len(cols):
                continue
            to = k_at[g, span[cols]]
            q_rows, do_rows = (np.asarray(x[h, at], np.float64) for x in (q, do))
            found["dk"][to] += b["ds"][:, cols].T @ q_rows
            found["dv"][to] += b["p"][:, cols].T @ do_rows
            gathered["dk_weight"][to] += b["ds_weight"][:, cols].T @ np.abs(q_rows)
            gathered["dk_abs"][to] += np.abs(b["ds"][:, cols]).T @ np.abs(q_rows)
            gathered["dv_weight"][to] += b["p_weight"][:, cols].T @ np.abs(do_rows)
            gathered["dv_abs"][to] += b["p"][:, cols].T @ np.abs(do_rows)
            count[to] += seen[:, cols].sum(axis=0)
    return {**found, **along,
            "dk_bound": gathered_bound(gathered["dk_weight"], gathered["dk_abs"], count, dtype),
            "dv_bound": gathered_bound(gathered["dv_weight"], gathered["dv_abs"], count, dtype)}


def gathered_bound(weight: np.ndarray, magnitude: np.ndarray, count: np.ndarray, dtype: str,
                   xp: Any = np) -> np.ndarray:
    """A dk or dv row's bound from what it gathered over the query rows that see it
    (``backward_rows``): Σ weight·|x| and Σ |term|·|x| [..., keys, d] over ``count``
    rows [..., keys]."""
    unit = UNIT[dtype]
    return (weight + gamma(count + 2, xp)[..., None] * magnitude) * (1 + unit) + UNDERFLOW[dtype]


def every_gradient_bound(params: dict[str, Any], inputs: dict[str, np.ndarray]
                         ) -> dict[str, np.ndarray]:
    """``gradient_bounds`` at every row: dq [Hq, S, d], dk [Hkv, S, d], dv [Hkv, S, dv]
    and their bounds."""
    return _shaped(inputs, gradient_bounds(params, inputs, _every(inputs["q"]),
                                           _every(inputs["k"])))


def _shaped(inputs: dict[str, np.ndarray], found: dict[str, np.ndarray]
            ) -> dict[str, np.ndarray]:
    return {name: value.reshape((*np.shape(inputs["q" if name.startswith(("dq", "out"))
                                                   else "k"])[:2], -1))
            for name, value in found.items()}


def dense_bounds(inputs: dict[str, np.ndarray], visible: np.ndarray, cap: float | None,
                 dtype: str) -> dict[str, np.ndarray]:
    """Every element's bound under a dense mask ([S, S] or [Hq, S, S]: a kernel test's
    own, segments folded in): ``out`` and ``out_bound``, and with a cotangent ``do`` in
    ``inputs`` the gradients' (``gradient_bounds``)."""
    see = mask_visibility(visible)
    out, bound = _forward_at(inputs, see, cap, dtype, *_every(inputs["q"]))
    found = {"out": out, "out_bound": bound}
    if "do" in inputs:
        found.update(_gradients_at(inputs, see, cap, dtype, _every(inputs["q"]),
                                   _every(inputs["k"])))
    return _shaped(inputs, found)


def compare(got: np.ndarray, want: np.ndarray, bound: np.ndarray, atol: float, rtol: float,
            sampled: dict[str, Any] | None = None, unwritten: int = 0) -> dict[str, Any]:
    """|got − want| ≤ atol + bound + rtol |want| per element (``bound`` this module's, rtol
    the output's rounding); NaN or inf never passes, nor does a shape change. ``sampled``:
    the rows checked (``unwritten`` non-finite elements elsewhere fail too)."""
    if got.shape != want.shape:
        return {"passed": False, "error": f"shape {got.shape} != oracle {want.shape}",
                "nan_count": 0, "max_abs_error": None, "max_rel_error": None,
                "worst_error_over_tolerance": None}
    values = got.astype(np.float64)
    finite = np.isfinite(values)
    allowed = atol + bound + rtol * np.abs(want)
    err = np.where(finite, np.abs(values - want), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(finite, np.where(err == 0, 0.0, err / allowed), np.inf)
    bad = int(np.count_nonzero(~finite)) + unwritten
    found = {"atol_applied": {"min": float((atol + bound).min(initial=np.inf)),
                              "median": float(np.median(atol + bound)) if bound.size else None,
                              "max": float((atol + bound).max(initial=0.0))},
             "rtol_applied": rtol,
             "passed": bad == 0 and bool(np.all(ratio <= 1)),
             "nan_count": bad,
             "max_abs_error": float(err.max(initial=0.0)),
             "max_rel_error": float(np.where(err == 0, 0.0, err / np.maximum(
                 np.maximum(np.abs(want), allowed), np.finfo(np.float64).tiny)).max(initial=0.0)),
             "worst_error_over_tolerance": None if bad else float(ratio.max(initial=0.0))}
    return {**found, "sampled": sampled} if sampled is not None else found


def along_d(got: np.ndarray, want: np.ndarray, free_bound: np.ndarray,
            direction: np.ndarray, shift: np.ndarray, atol: float, rtol: float,
            sampled: dict[str, Any] | None = None, unwritten: int = 0) -> dict[str, Any]:
    """``compare`` of dq allowing each row the one error a correct kernel may make beyond
    ``free_bound``: D's, ``c_i w_i`` with |c_i| ≤ ``shift_i`` along ``direction`` w_i
    (``backward_rows``). Each row's c_i is the one that minimises its worst element over
    the tolerance (a convex function of c_i, found by golden section), so the check
    passes where some admissible c_i brings every element within its bound, and fails
    otherwise; the record says how much of the allowed shift was used."""
    d = got.shape[-1]
    values = got.astype(np.float64).reshape(-1, d)
    error, w = (values - want.reshape(-1, d)), direction.reshape(-1, d)
    allowed = (atol + free_bound + rtol * np.abs(want)).reshape(-1, d)
    limit = np.broadcast_to(shift.reshape(-1, 1), (len(values), 1))
    finite = np.isfinite(error).all(axis=1, keepdims=True)
    error = np.where(finite, error, 0.0)

    def worst(c: np.ndarray) -> np.ndarray:
        return (np.abs(error - c * w) / allowed).max(axis=1, keepdims=True)

    # golden section, one evaluation a step: the bracket shrinks to 0.618⁴⁸ ≈ 1e-10 of
    # its width; a c short of the optimum only makes the check stricter, never looser
    golden = (np.sqrt(5) - 1) / 2
    low, high = -limit.copy(), limit.copy()
    a, b = high - golden * (high - low), low + golden * (high - low)
    worst_a, worst_b = worst(a), worst(b)
    for _ in range(48):
        left = worst_a <= worst_b  # the minimum lies in [low, b]: b becomes a
        low, high = np.where(left, low, a), np.where(left, b, high)
        probe = np.where(left, high - golden * (high - low), low + golden * (high - low))
        found_at = worst(probe)
        a, worst_a, b, worst_b = (
            np.where(left, probe, b), np.where(left, found_at, worst_b),
            np.where(left, a, probe), np.where(left, worst_a, found_at))
    c = np.where(finite, (low + high) / 2, 0.0)
    found = compare((values - c * w).reshape(got.shape), want, free_bound, atol, rtol,
                    sampled, unwritten)  # a row not finite stays so, and fails
    used = np.where(limit > 0, np.abs(c) / np.where(limit > 0, limit, 1.0), 0.0)
    return {**found, "along_d": {"max_shift_over_bound": float(used.max(initial=0.0))}}


def dense_check(got: dict[str, np.ndarray], want: dict[str, np.ndarray],
                operands: dict[str, np.ndarray], visible: np.ndarray, cap: float | None,
                tolerance: Callable[[str], tuple[float, float]]) -> dict[str, dict[str, Any]]:
    """``compare`` of every output of ``got`` (out, dq, dk, dv) with ``want``'s, under a
    dense mask (``dense_bounds``): ``operands`` q, k, v as the kernel read them (k, v
    [S, d] under MQA) and do for the gradients; ``tolerance(name)`` gives (atol, rtol)."""
    shaped = {n: (np.asarray(x)[None] if n in ("k", "v") and np.ndim(x) == 2 else
                  np.asarray(x)) for n, x in operands.items()}
    found = dense_bounds(shaped, visible, cap, shaped["q"].dtype.name)
    results = {}
    for name, value in got.items():
        expected = np.asarray(want[name], np.float64)
        if name == "dq":
            results[name] = along_d(
                np.asarray(value), expected, found["dq_free_bound"].reshape(expected.shape),
                found["dq_direction"].reshape(expected.shape),
                found["dq_shift"].reshape((*expected.shape[:-1], 1)), *tolerance(name))
            continue
        results[name] = compare(np.asarray(value), expected,
                                found[f"{name}_bound"].reshape(expected.shape),
                                *tolerance(name))
    return results
