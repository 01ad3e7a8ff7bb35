"""Case 02's mutants: attention outputs and gradients a subtly wrong kernel would write.

Each structural mutant recomputes attention on a perturbed problem (a mask block flipped,
the last kv block skipped, the soft cap or its derivative dropped) and rounds it to the
input dtype, as a correct kernel rounds its outputs (``model_outputs``): with the dense
float64 oracle where the check has it, else (S from 2048, where the oracle answers sampled
rows) with the float32 reference on the device, whose every element the check also reads
(``oracle_f32``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels import contract
from kernels.mutants import Mutant, bias
from kernels.splash_attention import masks, oracle_f32, oracle_f64, oracle_vjp

BLOCK = 64  # the port's smallest q and kv tile: the granularity of its mask blocks
KEEP = object()  # ``_outputs``'s soft_cap: the point's own


def rounded(inputs: dict[str, np.ndarray], values: Any) -> np.ndarray:
    """``values`` rounded to the inputs' dtype, as the port writes every output."""
    return np.asarray(values, np.float64).astype(inputs["q"].dtype)


def _outputs(params, inputs, want, edit=oracle_f32.NO_EDIT, soft_cap=KEEP, output="out",
             cap_gradient=True):
    """``output`` of attention changed by ``edit`` (and ``soft_cap``, ``cap_gradient``),
    rounded as the port writes it: from the dense float64 oracle where ``want`` is the
    dense oracle's, else (sampled rows: the problem is past the dense oracle) from the
    float32 reference on the device (``oracle_f32``)."""
    cap = params.get("soft_cap") if soft_cap is KEEP else soft_cap
    if isinstance(want.get("out"), contract.SampledRows):
        found = oracle_f32.references({**params, "soft_cap": cap}, inputs,
                                      output in oracle_f32.GRADIENTS, edit, cap_gradient)
        return rounded(inputs, found[output])
    visible = (masks.visible(params) if edit.segments else masks.dense_mask(params)).copy()
    r0, r1, c0, c1 = edit.block
    visible[r0:r1, c0:c1] = edit.block_visible
    if edit.also is not None:
        rows = np.flatnonzero(edit.also >= 0)
        visible[rows, edit.also[rows]] = True
    if output == "out":
        return rounded(inputs, oracle_f64.attention(inputs["q"], inputs["k"], inputs["v"],
                                                    visible, soft_cap=cap))
    grads = oracle_vjp.gradients(inputs["q"], inputs["k"], inputs["v"], inputs["do"],
                                    visible, soft_cap=cap, cap_gradient=cap_gradient)
    return rounded(inputs, grads[oracle_f32.GRADIENTS.index(output) + 1])


def block_counts(params: dict[str, Any]) -> np.ndarray:
    """[S/BLOCK, S/BLOCK]: how many (query, key) pairs of each mask block are visible, from
    the rows' visible ranges (no [S, S] array)."""
    low, high = masks.visible_range(params)
    starts = np.arange(0, params["seq_len"], BLOCK)
    seen = np.maximum(np.minimum(high[:, None], starts[None] + BLOCK - 1)
                      - np.maximum(low[:, None], starts[None]) + 1, 0)
    return seen.reshape(-1, BLOCK, len(starts)).sum(axis=1)


def partial_block(params: dict[str, Any]) -> tuple[int, int] | None:
    """The last (q block, kv block), row-major, of the visible mask that is partially
    visible, or None where every block is empty or full."""
    seen = block_counts(params)
    partial = np.argwhere((seen > 0) & (seen < BLOCK * BLOCK))
    return tuple(int(i) for i in partial[-1]) if len(partial) else None


def _partial_block_as_full(params, inputs, want, correct):
    found = partial_block(params)
    if found is None:
        return None
    i, j = found
    block = (i * BLOCK, (i + 1) * BLOCK, j * BLOCK, (j + 1) * BLOCK)
    return _outputs(params, inputs, want, oracle_f32.Edit(block=block, block_visible=True))


def _last_kv_block_masked(params, inputs, want, correct):
    n = params["seq_len"]
    return _outputs(params, inputs, want, oracle_f32.Edit(block=(0, n, n - BLOCK, n)))


def _soft_cap_dropped(params, inputs, want, correct):
    if params.get("soft_cap") is None:
        return None
    return _outputs(params, inputs, want, soft_cap=None)


def _soft_cap_derivative_dropped(output):
    def make(params, inputs, want, correct):
        if params.get("soft_cap") is None:
            return None
        return _outputs(params, inputs, want, output=output, cap_gradient=False)
    return make


def _kv_heads_interleaved(params, inputs, want, correct):
    """Query head h reads kv head h mod Hkv, not h // (Hq / Hkv): the grouped-query map
    transposed (GQA only: under MHA and MQA the two maps agree)."""
    heads_q, heads_kv = params["heads_q"], params["heads_kv"]
    if heads_kv in (1, heads_q):
        return None
    wrong = np.arange(heads_q) % heads_kv
    return _outputs({**params, "heads_kv": heads_q}, {
        **inputs, "k": inputs["k"][wrong], "v": inputs["v"][wrong]}, want)


def _next_key_seen(params, inputs, want, correct):
    """Query i also sees key i + 1 where the mask hides it (a causal diagonal off by one)."""
    low, high = masks.visible_range(params)
    rows = np.arange(params["seq_len"] - 1)
    hidden = (rows + 1 < low[rows]) | (rows + 1 > high[rows])
    if not hidden.any():
        return None
    also = np.full(params["seq_len"], -1)
    also[rows[hidden]] = rows[hidden] + 1
    return _outputs(params, inputs, want, oracle_f32.Edit(also=also))


def _segment_boundary_dropped(params, inputs, want, correct):
    if masks.segment_ids(params) is None:
        return None
    return _outputs(params, inputs, want, oracle_f32.Edit(segments=False))


def _last_head_zeroed(params, inputs, want, correct):
    got = correct.copy()
    got[-1] = 0
    return got


def _last_kv_rows_zeroed(params, inputs, want, correct):
    got = correct.copy()
    got[..., -BLOCK:, :] = 0  # [Hkv, Skv, D], or [Skv, D] under MQA
    return got


def mutants(params: dict[str, Any]) -> list[Mutant]:
    return [
        bias("out"),
        Mutant("partial_block_as_full", "out",
               f"the last partially visible {BLOCK}×{BLOCK} mask block treated as fully "
               "visible", _partial_block_as_full),
        Mutant("last_kv_block_skipped", "out",
               f"the last {BLOCK} keys masked out for every query", _last_kv_block_masked),
        Mutant("soft_cap_dropped", "out", "the logits left uncapped", _soft_cap_dropped),
        Mutant("kv_heads_interleaved", "out",
               "query head h reading kv head h mod Hkv instead of its group's",
               _kv_heads_interleaved),
        Mutant("next_key_seen", "out",
               "each query also seeing the next key, hidden by the mask (the causal diagonal "
               "off by one)", _next_key_seen),
        Mutant("segment_boundary_dropped", "out",
               "packed sequences attending across their segment boundaries",
               _segment_boundary_dropped),
        bias("dq"),
        Mutant("one_head_zeroed", "dq", "the last query head's dq left at 0",
               _last_head_zeroed),
        bias("dk"),
        Mutant("soft_cap_derivative_dropped", "dk",
               "the soft cap's derivative 1 - tanh² dropped in the backward (straight "
               "through)", _soft_cap_derivative_dropped("dk")),
        bias("dv"),
        Mutant("last_kv_block_skipped", "dv",
               f"the dv rows of the last {BLOCK} keys left at 0", _last_kv_rows_zeroed),
    ]
