"""The row oracle (kernels/splash_attention/oracle_rows.py) against the dense float64
oracle and its autodiff, every row of small problems; what a sample covers; and the case
oracle's sampled rows as verification checks them."""

from __future__ import annotations

import numpy as np
import pytest

import kernels.splash_attention as splash
from casebook.stages import verify
from kernels import contract
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


def test_key_rows_come_from_a_few_kv_heads_whose_statistics_alone_are_computed(rng):
    """At S 32768 a query head's statistics cost seconds: a sample's key rows come from
    KEY_HEADS kv heads, and only their groups' statistics are computed, exactly."""
    params = {"heads_q": 12, "heads_kv": 6, "seq_len": 40, "head_dim": 8,
              "mask": {"kind": "causal"}}
    picked = oracle_rows.sample(params, rng, 10_000)
    groups = sorted(set(picked["kv_heads"].tolist()))
    assert len(groups) == oracle_rows.KEY_HEADS < params["heads_kv"]
    assert len(picked["key_rows"]) == oracle_rows.KEY_HEADS * 40
    assert len(set(picked["query_heads"].tolist())) == 12  # query rows: every head
    inputs = draw(params, rng)
    lse, delta = oracle_rows.statistics(params, inputs, kv_heads=picked["kv_heads"])
    computed = [h for g in groups for h in (2 * g, 2 * g + 1)]
    left = sorted(set(range(12)) - set(computed))
    assert np.isneginf(lse[left]).all() and not delta[left].any()
    want = dense(params, inputs)
    np.testing.assert_allclose(lse[computed], want["lse"][computed], rtol=0, atol=1e-10)
    got = oracle_rows.key_rows(params, inputs, (lse, delta), picked["kv_heads"],
                               picked["key_rows"])
    for output in ("dk", "dv"):
        expected = want[output][picked["kv_heads"], picked["key_rows"]]
        np.testing.assert_allclose(got[output], expected, rtol=0,
                                   atol=1e-10 * np.sqrt(np.mean(expected ** 2)))


def test_operands_of_the_wrong_shape_are_refused(rng):
    params = POINTS["local_gqa"]
    inputs = draw(params, rng)
    with pytest.raises(ValueError, match="multiple of k's"):
        oracle_rows.query_rows(params, {**inputs, "q": inputs["q"][:3], "do": inputs["do"][:3]},
                               [0], [0])
    with pytest.raises(ValueError, match=r"needs q, do \[Hq, S, d\]"):
        oracle_rows.statistics(params, {**inputs, "k": inputs["k"][0]})


# -- the sampled oracle as verification reads it ------------------------------------------

@pytest.mark.parametrize("name", sorted(POINTS))
def test_the_sampled_oracle_gives_the_dense_oracles_rows_and_says_which(name, rng):
    params = POINTS[name]
    inputs = draw(params, rng)
    want, seed = dense(params, inputs), int(rng.integers(2**62))
    sampled = splash.sampled_oracle(params, inputs, seed, count=20)
    assert sampled["out"].shape == want["out"].shape and sampled["dk"].shape == want["dk"].shape
    for output, rows in sampled.items():
        assert rows.seed == seed and rows.rows == 20
        np.testing.assert_allclose(rows.values(), want[output][rows.index], rtol=1e-11,
                                   atol=1e-12)


def test_a_forward_check_on_sampled_rows_never_computes_the_key_statistics(monkeypatch, rng):
    params = POINTS["causal_mha"]
    inputs = draw(params, rng)
    monkeypatch.setattr(oracle_rows, "statistics", lambda *a: pytest.fail("computed"))
    want = splash.sampled_oracle(params, inputs, 7, count=8)
    found = verify.compare(dense(params, inputs)["out"], want["out"], 1e-9, 0)
    assert found["passed"] and found["sampled"] == {"rows": 8, "of": 192, "seed": 7}


def test_a_check_on_sampled_rows_fails_a_wrong_sampled_row_a_nan_anywhere_and_a_shape(rng):
    """A wrong value where a row is sampled fails; a NaN (an unwritten poisoned element)
    fails wherever it is, sampled or not; so does a shape the oracle does not have."""
    params = POINTS["local_gqa"]
    inputs = draw(params, rng)
    right = dense(params, inputs)["dq"]
    want = splash.sampled_oracle(params, inputs, int(rng.integers(2**62)), count=5)["dq"]
    assert verify.compare(right, want, 1e-9, 1e-9)["passed"]
    wrong = right.copy()
    h, i = want.index[0][3], want.index[1][3]
    wrong[h, i, 2] += 1e-3
    assert not verify.compare(wrong, want, 1e-9, 1e-9)["passed"]
    unsampled = sorted(set(np.ndindex(*right.shape[:2])) - set(zip(*want.index, strict=True)))
    nan = right.copy()
    nan[unsampled[int(rng.integers(len(unsampled)))]] = np.nan
    found = verify.compare(nan, want, 1e-9, 1e-9)
    assert not found["passed"] and found["nan_count"] == right.shape[2]
    found = verify.compare(right[:, :-1], want, 1e-9, 1e-9)
    assert not found["passed"] and "shape" in found["error"]


def test_from_its_threshold_the_case_oracle_answers_sampled_rows(rng):
    params = {"heads_q": 1, "heads_kv": 1, "seq_len": splash.ROWS_FROM_SEQ_LEN, "head_dim": 8,
              "mask": {"kind": "causal"}, "dtype": "float32"}
    inputs = splash.make_inputs(params, rng)
    found = splash.oracle(params, inputs)
    assert all(isinstance(r, contract.SampledRows) and r.rows == splash.SAMPLED_ROWS
               for r in found.values())
    assert len({r.seed for r in found.values()}) == 1
