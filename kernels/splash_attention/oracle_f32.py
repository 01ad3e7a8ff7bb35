"""Every element against a float32 reference on the device, within the bound.

The float64 rows (``oracle_rows``) check a sample exactly; a fault confined to a few rows
(one kv block of dv, one head) slips past a sample. This checks every element of every
output, on the device jax has (the chip, where a TPU host verifies): the float32 reference
and each element's bound come from one pass of ``bounds``'s own formulas in jax.numpy
(``bounds.backward_rows`` with ``xp=jax.numpy``), matmuls at the highest precision, a
chunk of query rows of every head at a time against every key (the visible ones kept by
``masks.visible_range`` and the segment ids, as the kernels see them).

The kernel and the reference each keep within their bound of the exact answer (the
reference's own bound is the kernel's with float32's units, computed in the same pass), so
|got − reference| ≤ bound + own bound (+ the output's rounding, rtol, and atol). SLACK
allows for the bounds themselves being evaluated in float32: each of their terms is a sum
of non-negative parts, accurate to γ_S (0.2% at S 32768).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from kernels.splash_attention import bounds, masks

SLACK = 1.01  # the bound's own float32 evaluation (module docstring)
CHUNK_ELEMENTS = 2**24  # heads × rows × keys of one chunk's [Hq, rows, S] terms (64 MiB)
GRADIENTS = ("dq", "dk", "dv")  # the backward's outputs, named once for case 02


def chunk_rows(heads: int, seq_len: int) -> int:
    """Query rows a chunk takes: a power of two dividing ``seq_len``, within
    CHUNK_ELEMENTS, at most 256."""
    rows = 256
    while rows > 1 and (rows * heads * seq_len > CHUNK_ELEMENTS or seq_len % rows):
        rows //= 2
    return rows


@dataclasses.dataclass(frozen=True)
class Edit:
    """A near miss's change to which keys the rows see (``near_misses``), applied over the
    point's mask and segments: the rectangle ``block`` (rows r0:r1, keys c0:c1) set to
    ``block_visible``; one more key a row, ``also`` ([S], -1: none); the segment ids
    dropped (``segments`` False)."""

    block: tuple[int, int, int, int] = (0, 0, 0, 0)
    block_visible: bool = False
    also: np.ndarray | None = None
    segments: bool = True


NO_EDIT = Edit()


def references(params: dict[str, Any], inputs: dict[str, np.ndarray], gradients: bool,
               edit: Edit = NO_EDIT, cap_gradient: bool = True) -> dict[str, Any]:
    """The float32 reference of every element and its bounds, on the default device:
    ``out``, ``out_bound`` (a kernel's) and ``out_own_bound`` (the reference's), and with
    ``gradients`` ``dq``, ``dk``, ``dv`` and theirs (for the cotangent ``inputs["do"]``);
    jax arrays, left on the device. ``edit`` and
    ``cap_gradient=False`` make a near miss's outputs instead (its bounds mean nothing);
    the heads are the arrays' (k, v of any kv head count dividing q's)."""
    unpacked = params if edit.segments else {**params, "segments": None}
    low, high = masks.visible_range(unpacked)
    ids = masks.segment_ids(unpacked)
    q, k, v = (jnp.asarray(inputs[n]) for n in ("q", "k", "v"))
    do = jnp.asarray(inputs["do"]) if gradients else None
    n = q.shape[1]
    also = np.full(n, -1) if edit.also is None else np.asarray(edit.also)
    with jax.default_matmul_precision("highest"):
        return _pass(q, k, v, do, jnp.asarray(low, jnp.int32), jnp.asarray(high, jnp.int32),
                     None if ids is None else jnp.asarray(ids),
                     jnp.asarray(edit.block, jnp.int32), jnp.asarray(edit.block_visible),
                     jnp.asarray(also, jnp.int32), cap=params.get("soft_cap"),
                     dtype=params["dtype"], rows=chunk_rows(q.shape[0], n),
                     cap_gradient=cap_gradient, sigma=bounds.v_sigma(inputs["v"]))


@functools.partial(jax.jit, static_argnames=("cap", "dtype", "rows", "cap_gradient",
                                             "sigma"))
def _pass(q, k, v, do, low, high, ids, block, block_visible, also, *, cap, dtype, rows,
          cap_gradient, sigma):
    heads, n, _ = q.shape
    group = heads // k.shape[0]
    keys, values = (jnp.repeat(x.astype(jnp.float32), group, axis=0) for x in (k, v))
    cols = jnp.arange(n)

    def chunk(start):
        at = start + jnp.arange(rows)
        seen = (cols[None] >= low[at][:, None]) & (cols[None] <= high[at][:, None])
        if ids is not None:
            seen &= ids[cols][None] == ids[at][:, None]
        inside = ((at[:, None] >= block[0]) & (at[:, None] < block[1])
                  & (cols[None] >= block[2]) & (cols[None] < block[3]))
        seen = jnp.where(inside, block_visible, seen) | (cols[None] == also[at][:, None])
        return seen, lambda x: lax.dynamic_slice_in_dim(x.astype(jnp.float32), start, rows, 1)

    def put(into, value, start):
        return lax.dynamic_update_slice_in_dim(into, value, start, 1)

    def kv_sum(x):  # [Hq, S, d] summed over each kv head's group of query heads
        return x.reshape(k.shape[0], group, *x.shape[1:]).sum(axis=1)

    shape = (heads, n, v.shape[2])
    # Each bound twice: the kernel's (its dtype's units) and the reference's own (float32's).
    units = {"bound": dtype, "own_bound": "float32"}
    if do is None:
        def forward_step(i, found):
            seen, take = chunk(i * rows)
            q_at = take(q)
            made = {}
            for suffix, unit in units.items():
                made["out"], made[f"out_{suffix}"] = jax.vmap(
                    lambda qh, kh, vh, unit=unit: bounds.forward_rows(
                        qh, kh, vh, seen, cap, unit, xp=jnp, sigma=sigma))(q_at, keys, values)
            return {name: put(found[name], value, i * rows) for name, value in made.items()}

        zero = jnp.zeros(shape, jnp.float32)
        return lax.fori_loop(0, n // rows, forward_step,
                             {"out": zero, **{f"out_{suffix}": zero for suffix in units}})

    def backward_step(i, found):
        seen, take = chunk(i * rows)
        q_at, do_at = take(q), take(do)
        mag_q, mag_do = jnp.abs(q_at), jnp.abs(do_at)

        def gather(x, y):  # [Hq, rows, S] weights of rows onto keys, summed per kv head
            return kv_sum(jnp.einsum("hrs,hrd->hsd", x, y))

        step = {"count": found["count"] + group * seen.sum(axis=0)}
        for suffix, unit in units.items():
            b = jax.vmap(lambda qh, dh, kh, vh, unit=unit: bounds.backward_rows(
                qh, dh, kh, vh, seen, cap, unit, xp=jnp, cap_gradient=cap_gradient,
                sigma=sigma))(q_at, do_at, keys, values)
            made = {"out": b["out"], "dq": b["dq"], f"out_{suffix}": b["out_bound"],
                    f"dq_{suffix}": b["dq_bound"]}
            step |= {name: put(found[name], value, i * rows) for name, value in made.items()}
            step |= {name: found[name] + gather(x, y) for name, x, y in (
                ("dk", b["ds"], q_at), ("dv", b["p"], do_at),
                (f"dk_weight_{suffix}", b["ds_weight"], mag_q),
                (f"dk_abs_{suffix}", jnp.abs(b["ds"]), mag_q),
                (f"dv_weight_{suffix}", b["p_weight"], mag_do),
                (f"dv_abs_{suffix}", b["p"], mag_do))}
        return step

    zero_q = jnp.zeros(q.shape, jnp.float32)
    zero_kv = {"dk": jnp.zeros((*k.shape[:2], q.shape[2]), jnp.float32),
               "dv": jnp.zeros((*k.shape[:2], v.shape[2]), jnp.float32)}
    start = {"out": jnp.zeros(shape, jnp.float32), "dq": zero_q, **zero_kv,
             "count": jnp.zeros(n, jnp.float32)}
    for suffix in units:
        start |= {f"out_{suffix}": jnp.zeros(shape, jnp.float32), f"dq_{suffix}": zero_q,
                  **{f"{g}_{part}_{suffix}": zero_kv[g] for g in zero_kv
                     for part in ("weight", "abs")}}
    found = lax.fori_loop(0, n // rows, backward_step, start)
    return {**{name: found[name] for name in ("out", *GRADIENTS)},
            **{f"{name}_{suffix}": found[f"{name}_{suffix}"] for name in ("out", "dq")
               for suffix in units},
            **{f"{g}_{suffix}": bounds.gathered_bound(found[f"{g}_weight_{suffix}"],
                                                      found[f"{g}_abs_{suffix}"],
                                                      found["count"], unit, xp=jnp)
               for g in zero_kv for suffix, unit in units.items()}}


def described() -> str:
    """The reference in words, naming the device that computed it."""
    return (f"float32 reference on {jax.devices()[0].device_kind} (matmuls at the highest "
            "precision), each element within the kernel's bound plus the reference's own")


def check(got: Any, reference: Any, bound: Any, own_bound: Any, atol: float, rtol: float
          ) -> dict[str, Any]:
    """``got`` (any shape of the reference's) against the float32 reference at every
    element: |got − ref| ≤ atol + SLACK·(bound + own_bound) + rtol·(|ref| + own_bound);
    NaN and inf never pass. How many elements exceed it, the worst error over it, the
    largest error."""
    got = jnp.asarray(got)
    if got.shape != reference.shape:
        return {"passed": False, "error": f"shape {got.shape} != reference {reference.shape}"}
    worst, over, bad, largest = (float(x) for x in _judge(got, reference, bound, own_bound,
                                                          atol, rtol))
    return {"passed": bad == 0 and over == 0, "elements": int(np.prod(reference.shape)),
            "elements_over": int(over), "nan_count": int(bad), "max_abs_error": largest,
            "worst_error_over_tolerance": None if bad else worst}


@jax.jit
def _judge(got, reference, bound, own_bound, atol, rtol):
    values = got.astype(jnp.float32)
    finite = jnp.isfinite(values)
    err = jnp.where(finite, jnp.abs(values - reference), 0.0)
    allowed = atol + SLACK * (bound + own_bound) + rtol * (jnp.abs(reference) + own_bound)
    ratio = jnp.where(err == 0, 0.0, err / allowed)
    return (ratio.max(), jnp.count_nonzero(finite & (ratio > 1)),
            jnp.count_nonzero(~finite), err.max())
