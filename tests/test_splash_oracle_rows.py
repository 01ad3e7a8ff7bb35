"""The row oracle (kernels/splash_attention/oracle_rows.py) against the dense float64
oracle and its autodiff, every row of small problems; and what a sample covers."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.splash_attention import masks, oracle_f64, oracle_rows, oracle_vjp

POINTS = {
    "causal_mha": {"heads_q": 2, "heads_kv": 2, "seq_len": 96, "head_dim": 16,
                   "mask": {"kind": "causal"}},
    "local_gqa": {"heads_q": 4, "heads_kv": 2, "seq_len": 80, "head_dim": 8,
                  "mask": {"kind": "local", "window": [7, 3]}},
    "packed_softcap_mqa": {"heads_q": 3, "heads_kv": 1, "seq_len": 64, "head_dim": 16,
                           "mask": {"kind": "causal"}, "segments": 3, "soft_cap": 2.5},
}


def draw(params, rng):
    s, d = params["seq_len"], params["head_dim"]
    shape_q, shape_kv = (params["heads_q"], s, d), (params["heads_kv"], s, d)
    return {"q": rng.standard_normal(shape_q), "k": rng.standard_normal(shape_kv),
            "v": rng.standard_normal(shape_kv), "do": rng.standard_normal(shape_q)}


def dense(params, inputs):
    ids = masks.segment_ids(params)
    segments = None if ids is None else (ids, ids)
    cap = params.get("soft_cap")
    out, lse = oracle_f64.attention(inputs["q"], inputs["k"], inputs["v"],
                                    masks.dense_mask(params), segment_ids=segments,
                                    soft_cap=cap, return_lse=True)
    _, dq, dk, dv = oracle_vjp.gradients(inputs["q"], inputs["k"], inputs["v"], inputs["do"],
                                         masks.dense_mask(params), segment_ids=segments,
                                         soft_cap=cap)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


@pytest.mark.parametrize("name", sorted(POINTS))
def test_every_row_matches_the_dense_oracle(rng, name):
    """Both float64, summing the same terms in other orders: 1e-10 of each output's scale
    is a million times their rounding, and a hundred-millionth of any real error."""
    params = POINTS[name]
    inputs = draw(params, rng)
    want = dense(params, inputs)
    heads, n = params["heads_q"], params["seq_len"]
    h, i = np.divmod(np.arange(heads * n), n)
    got = oracle_rows.query_rows(params, inputs, h, i)
    stats = oracle_rows.statistics(params, inputs, chunk=17)  # chunks that split rows
    np.testing.assert_allclose(stats[0].ravel(), want["lse"].ravel(), rtol=0, atol=1e-10)
    g, j = np.divmod(np.arange(params["heads_kv"] * n), n)
    got |= oracle_rows.key_rows(params, inputs, stats, g, j)
    for output in ("out", "lse", "dq", "dk", "dv"):
        expected = want[output].reshape(got[output].shape)
        scale = np.sqrt(np.mean(expected ** 2))
        np.testing.assert_allclose(got[output], expected, rtol=0, atol=1e-10 * scale,
                                   err_msg=output)


def test_a_sample_is_distinct_rows_of_the_stated_heads_and_all_of_a_small_problem(rng):
    params = POINTS["local_gqa"]
    picked = oracle_rows.sample(params, rng, 50)
    pairs = set(zip(picked["query_heads"], picked["query_rows"], strict=True))
    assert len(pairs) == 50 and all(0 <= h < 4 and 0 <= i < 80 for h, i in pairs)
    assert set(picked["kv_heads"]) <= {0, 1}
    everything = oracle_rows.sample(params, rng, 10_000)
    assert len(everything["query_rows"]) == 4 * 80 and len(everything["key_rows"]) == 2 * 80


def test_operands_of_the_wrong_shape_are_refused(rng):
    params = POINTS["local_gqa"]
    inputs = draw(params, rng)
    with pytest.raises(ValueError, match="multiple of k's"):
        oracle_rows.query_rows(params, {**inputs, "q": inputs["q"][:3], "do": inputs["do"][:3]},
                               [0], [0])
    with pytest.raises(ValueError, match=r"needs q, do \[Hq, S, d\]"):
        oracle_rows.statistics(params, {**inputs, "k": inputs["k"][0]})
