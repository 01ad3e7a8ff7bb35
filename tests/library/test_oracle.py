"""The float64 oracle and the comparison every verification goes through."""

from __future__ import annotations

import numpy as np
import pytest

from casebook.stages.verify import compare
from kernels.splash_attention import masks, oracle_f64


def loop_attention(q, k, v, mask):
    """An independent, row-by-row float64 attention to check the oracle against."""
    group = q.shape[0] // k.shape[0]
    out = np.zeros((*q.shape[:2], v.shape[2]))
    for h in range(q.shape[0]):
        for i in range(q.shape[1]):
            keys = np.flatnonzero(mask[i])
            logits = np.array([q[h, i] @ k[h // group, j] for j in keys])
            w = np.exp(logits - logits.max())
            out[h, i] = (w / w.sum()) @ v[h // group, keys]
    return out


@pytest.mark.parametrize("mask", [{"kind": "causal"}, {"kind": "local", "window": [3, 1]}])
@pytest.mark.parametrize(("hq", "hkv"), [(2, 2), (4, 2), (3, 1)])
def test_oracle_matches_an_independent_loop(rng, mask, hq, hkv):
    params = {"seq_len": 12, "mask": mask}
    q = rng.standard_normal((hq, 12, 8))
    k, v = rng.standard_normal((2, hkv, 12, 8))
    dense = masks.dense_mask(params)
    np.testing.assert_allclose(oracle_f64.attention(q, k, v, dense),
                               loop_attention(q, k, v, dense), rtol=1e-12, atol=1e-12)


def test_masks_have_the_stated_shape():
    causal = masks.dense_mask({"seq_len": 5, "mask": {"kind": "causal"}})
    assert (causal == np.tril(np.ones((5, 5), bool))).all()
    local = masks.dense_mask({"seq_len": 6, "mask": {"kind": "local", "window": [1, 0]}})
    assert local.sum(axis=1).tolist() == [1, 2, 2, 2, 2, 2]
    assert local.diagonal().all()


def test_causal_first_row_attends_only_to_the_first_key(rng):
    q, k, v = rng.standard_normal((3, 1, 6, 4))
    causal = masks.dense_mask({"seq_len": 6, "mask": {"kind": "causal"}})
    out = oracle_f64.attention(q, k, v, causal)
    np.testing.assert_allclose(out[0, 0], v[0, 0], rtol=1e-14)


class TestCompare:
    def test_within_tolerance_passes_and_reports_errors(self, rng):
        want = rng.standard_normal(100)
        got = want + 1e-4
        result = compare(got, want, atol=1e-3, rtol=0)
        assert result["passed"]
        assert result["max_abs_error"] == pytest.approx(1e-4, rel=1e-6)
        assert result["worst_error_over_tolerance"] == pytest.approx(0.1, rel=1e-4)

    def test_one_element_over_tolerance_fails(self, rng):
        want = rng.standard_normal(100)
        got = want.copy()
        got[rng.integers(100)] += 0.1
        assert not compare(got, want, atol=1e-3, rtol=1e-3)["passed"]

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite_never_passes(self, rng, bad):
        want = rng.standard_normal(10)
        got = want.copy()
        got[3] = bad
        result = compare(got, want, atol=1e9, rtol=1e9)
        assert not result["passed"]
        assert result["nan_count"] == 1

    def test_shape_change_fails(self):
        assert not compare(np.zeros(4), np.zeros(5), atol=1, rtol=1)["passed"]


def loop_attention_full(q, k, v, mask, segments, cap):
    """Row by row with per-head masks, segment ids and soft cap; empty rows give 0."""
    group = q.shape[0] // k.shape[0]
    out = np.zeros((*q.shape[:2], v.shape[2]))
    lse = np.full(q.shape[:2], -np.inf)
    for h in range(q.shape[0]):
        for i in range(q.shape[1]):
            keys = [j for j in np.flatnonzero(mask[h, i]) if segments[0][i] == segments[1][j]]
            if not keys:
                continue
            logits = np.array([cap * np.tanh(q[h, i] @ k[h // group, j] / cap) for j in keys])
            w = np.exp(logits - logits.max())
            out[h, i] = (w / w.sum()) @ v[h // group, keys]
            lse[h, i] = logits.max() + np.log(w.sum())
    return out, lse


def test_oracle_with_segments_soft_cap_per_head_masks_and_empty_rows(rng):
    q = rng.standard_normal((4, 10, 8)) * 3
    k, v = rng.standard_normal((2, 2, 10, 8))
    mask = rng.random((4, 10, 10)) < 0.4
    mask[0, 3] = False  # a row that sees no key
    segments = (rng.integers(0, 3, 10), rng.integers(0, 3, 10))
    out, lse = oracle_f64.attention(q, k, v, mask, segment_ids=segments, soft_cap=2.0,
                                    return_lse=True)
    want_out, want_lse = loop_attention_full(q, k, v, mask, segments, 2.0)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
    finite = np.isfinite(want_lse)
    # lse = max + log Σ is near 0 for some rows: an absolute term (|lse| < 5 here, its
    # float64 error ~1e-15) keeps a relative tolerance from failing on a crossing.
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-12)
    assert (out[0, 3] == 0).all()
