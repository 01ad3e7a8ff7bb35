"""Case 02's mutants: attention outputs and gradients a subtly wrong kernel would write.

Each structural mutant recomputes the float64 oracle on a perturbed problem (a mask block
flipped, the last kv block skipped, the soft cap or its derivative dropped) and rounds it
to the input dtype, as a correct kernel rounds its outputs (``model_outputs``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.mutants import Mutant, bias
from kernels.splash_attention import masks, oracle_f64, oracle_vjp

BLOCK = 64  # the port's smallest q and kv tile: the granularity of its mask blocks


def rounded(inputs: dict[str, np.ndarray], values: np.ndarray) -> np.ndarray:
    """float64 ``values`` rounded to the inputs' dtype, as the port writes every output."""
    return np.asarray(values, np.float64).astype(inputs["q"].dtype)


def _forward(params, inputs, visible, soft_cap):
    """The oracle's ``out`` with ``visible`` ([S, S], segments included) and ``soft_cap``."""
    return rounded(inputs, oracle_f64.attention(inputs["q"], inputs["k"], inputs["v"],
                                                visible, soft_cap=soft_cap))


def partial_block(params: dict[str, Any]) -> tuple[int, int] | None:
    """The last (q block, kv block), row-major, of the visible mask that is partially
    visible, or None where every block is empty or full."""
    s = params["seq_len"]
    blocks = masks.visible(params).reshape(s // BLOCK, BLOCK, s // BLOCK, BLOCK)
    seen = blocks.sum(axis=(1, 3))
    partial = np.argwhere((seen > 0) & (seen < BLOCK * BLOCK))
    return tuple(int(i) for i in partial[-1]) if len(partial) else None


def _partial_block_as_full(params, inputs, want, correct):
    found = partial_block(params)
    if found is None:
        return None
    i, j = found
    visible = masks.visible(params).copy()
    visible[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = True
    return _forward(params, inputs, visible, params.get("soft_cap"))


def _last_kv_block_masked(params, inputs, want, correct):
    visible = masks.visible(params).copy()
    visible[:, -BLOCK:] = False
    return _forward(params, inputs, visible, params.get("soft_cap"))


def _soft_cap_dropped(params, inputs, want, correct):
    if params.get("soft_cap") is None:
        return None
    return _forward(params, inputs, masks.visible(params), None)


def _soft_cap_derivative_dropped(output):
    index = ("dq", "dk", "dv").index(output) + 1

    def make(params, inputs, want, correct):
        if params.get("soft_cap") is None:
            return None
        grads = oracle_vjp.gradients(inputs["q"], inputs["k"], inputs["v"], inputs["do"],
                                        masks.visible(params), soft_cap=params["soft_cap"],
                                        cap_gradient=False)
        return rounded(inputs, grads[index])
    return make


def _kv_heads_interleaved(params, inputs, want, correct):
    """Query head h reads kv head h mod Hkv, not h // (Hq / Hkv): the grouped-query map
    transposed (GQA only: under MHA and MQA the two maps agree)."""
    heads_q, heads_kv = params["heads_q"], params["heads_kv"]
    if heads_kv in (1, heads_q):
        return None
    wrong = np.arange(heads_q) % heads_kv
    return rounded(inputs, oracle_f64.attention(
        inputs["q"], inputs["k"][wrong], inputs["v"][wrong], masks.visible(params),
        soft_cap=params.get("soft_cap")))


def _next_key_seen(params, inputs, want, correct):
    """Query i also sees key i + 1 where the mask hides it (a causal diagonal off by one)."""
    visible = masks.visible(params)
    rows = np.arange(len(visible) - 1)
    hidden = ~visible[rows, rows + 1]
    if not hidden.any():
        return None
    leaked = visible.copy()
    leaked[rows[hidden], rows[hidden] + 1] = True
    return _forward(params, inputs, leaked, params.get("soft_cap"))


def _segment_boundary_dropped(params, inputs, want, correct):
    if masks.segment_ids(params) is None:
        return None
    return _forward(params, inputs, masks.dense_mask(params), params.get("soft_cap"))


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
