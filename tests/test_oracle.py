"""The float64 oracle and the comparison every verification goes through."""

from __future__ import annotations

import numpy as np
import pytest

from casebook.verify import compare
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
