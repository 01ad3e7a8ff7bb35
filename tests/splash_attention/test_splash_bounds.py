"""The splash bounds (kernels/splash_attention/bounds.py): their exact parts are the
oracle's, the sampled rows' bounds are the dense ones at those rows, a correct execution
stays inside them and fails without the term that covers its rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels.splash_attention as splash
from kernels.splash_attention import baselines, bounds, masks, oracle_rows

pytestmark = pytest.mark.host_rehearsal  # numpy bounds and XLA baselines: both stacks


def problem(dtype="bfloat16", **extra):
    return {"seq_len": 384, "heads_q": 4, "heads_kv": 2, "head_dim": 64, "head_dim_v": 64,
            "dtype": dtype, "mask": {"kind": "causal"}, **extra}


@pytest.mark.parametrize("extra", [{}, {"mask": {"kind": "local", "window": [100, 3]},
                                        "soft_cap": 3.0, "segments": 3}])
def test_the_exact_parts_are_the_oracles_and_rows_match_the_dense_bounds(extra):
    params = problem(**extra)
    inputs = splash.make_inputs(params, np.random.default_rng())
    want = splash.oracle(params, inputs)
    out, out_bound = bounds.out_bound(params, inputs)
    dense = bounds.every_gradient_bound(params, inputs)
    for name, value in (("out", out), *((g, dense[g]) for g in splash.GRADIENTS)):
        assert np.abs(value - want[name]).max() <= 1e-12 * np.abs(want[name]).max(), name
    picked = oracle_rows.sample(params, np.random.default_rng(), 40)
    queries = (picked["query_heads"], picked["query_rows"])
    keys = (picked["kv_heads"], picked["key_rows"])
    rows = bounds.gradient_bounds(params, inputs, queries, keys)
    np.testing.assert_allclose(bounds.rows_bound(params, inputs, *queries)[1],
                               out_bound[queries], rtol=1e-12)
    for name, at in (("dq", queries), ("dk", keys), ("dv", keys)):
        np.testing.assert_allclose(rows[f"{name}_bound"], dense[f"{name}_bound"][at],
                                   rtol=1e-12)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_dense_baseline_stays_inside_the_bound_and_fails_without_p_rounding(dtype,
                                                                               monkeypatch):
    params = problem(dtype)
    inputs = splash.make_inputs(params, np.random.default_rng())
    want = splash.oracle(params, inputs)["out"]
    got = np.asarray(jax.jit(baselines.dense_masked(params))(
        *(jnp.asarray(inputs[n]) for n in splash.INPUTS)))
    tolerance = {"atol": 0.0, "rtol": bounds.UNIT[dtype]}
    found = splash.compare(params, inputs, "out", got, want, tolerance)
    # Tight where P's rounding dominates; float32's worst-case sums (γ_n) are loose.
    assert found["passed"] and found["worst_error_over_tolerance"] > (
        0.005 if dtype == "float32" else 0.05), found
    if dtype != "float32":  # P rounded to the dtype is what the bound's T2 covers
        monkeypatch.setitem(bounds.UNIT, dtype, bounds.F32)
        assert not splash.compare(params, inputs, "out", got, want, tolerance)["passed"]
    biased = got.astype(np.float64) + 0.01 * np.sqrt(np.mean(want**2))
    assert not splash.compare(params, inputs, "out", biased, want, tolerance)["passed"]
    nan = got.astype(np.float64)
    nan[0, -1, 0] = np.nan
    assert not splash.compare(params, inputs, "out", nan, want, tolerance)["passed"]


def _dense_baseline_check(params, scale):
    """The dense baseline's out at ``params`` with q and v scaled (``scale``: name → factor),
    and a function that checks it against the bound as the module stands."""
    inputs = splash.make_inputs(params, np.random.default_rng())
    for name, factor in scale.items():
        inputs[name] = (inputs[name].astype(np.float64) * factor).astype(inputs[name].dtype)
    want = splash.oracle(params, inputs)["out"]
    got = np.asarray(jax.jit(baselines.dense_masked(params))(
        *(jnp.asarray(inputs[n]) for n in splash.INPUTS)))
    tolerance = {"atol": 0.0, "rtol": bounds.UNIT[params["dtype"]]}
    return lambda: splash.compare(params, inputs, "out", got, want, tolerance)["passed"]


@pytest.mark.parametrize(("dtype", "scale", "term", "dropped"), [
    # Outputs near 1e-6: f16 subnormals, whose rounding is half a step whatever |out|.
    ("float16", {"v": 1e-6}, "UNDERFLOW", {"float16": 0.0}),
    # Logits up to ~8: float32 dot products and sums over 384 keys.
    ("float32", {"q": 8.0}, "gamma", lambda n, xp=np: np.zeros_like(np.asarray(n, np.float64)))])
def test_a_correct_execution_fails_without_the_term_that_covers_it(dtype, scale, term,
                                                                   dropped, monkeypatch):
    check = _dense_baseline_check(problem(dtype), scale)
    assert check()
    if isinstance(dropped, dict):
        for key, value in dropped.items():
            monkeypatch.setitem(getattr(bounds, term), key, value)
    else:
        monkeypatch.setattr(bounds, term, dropped)
    assert not check()


def emulated_dq(params: dict, inputs: dict) -> np.ndarray:
    """dq as a kernel computes it, in numpy: D = do·out from the forward's output rounded
    to the dtype, dS = P (dP − D) rounded to the dtype before dS·k, dq rounded."""
    dtype = inputs["q"].dtype
    want = splash.oracle(params, inputs)
    visible = masks.dense_mask(params)
    group = params["heads_q"] // params["heads_kv"]
    dq = np.zeros(inputs["q"].shape)
    for h in range(params["heads_q"]):
        q, do = (inputs[n][h].astype(np.float64) for n in ("q", "do"))
        k, v = (inputs[n][h // group].astype(np.float64) for n in ("k", "v"))
        logits = np.where(visible, q @ k.T, -np.inf)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        d = (do * want["out"][h].astype(dtype).astype(np.float64)).sum(axis=1)
        ds = (p * (do @ v.T - d[:, None])).astype(dtype).astype(np.float64)
        dq[h] = ds @ k
    return dq.astype(dtype)


def test_dq_passes_by_ds_shift_along_d_and_fails_without_it_or_with_a_bias():
    """A kernel's D error moves a dq row along w_i = Σ_j P_ij k_j: the check allows that
    shift (bounds.along_d) within D's bound and nothing else. The emulated kernel passes;
    the same held to the bound without D's term and no shift fails; a 1% bias of dq's RMS
    (off w_i) fails; a shift along w_i past D's bound fails."""
    params = problem()
    inputs = splash.make_inputs(params, np.random.default_rng())
    want = splash.oracle(params, inputs)["dq"]
    got = emulated_dq(params, inputs)
    tolerance = {"atol": 0.0, "rtol": bounds.UNIT["bfloat16"]}
    found = splash.compare(params, inputs, "dq", got, want, tolerance)
    assert found["passed"] and found["along_d"]["max_shift_over_bound"] > 0.01, found
    terms = bounds.every_gradient_bound(params, inputs)
    unshifted = bounds.compare(got, want, terms["dq_free_bound"], **tolerance)
    assert not unshifted["passed"], unshifted  # D's error is there, and only the shift covers it
    assert found["worst_error_over_tolerance"] < unshifted["worst_error_over_tolerance"]
    rms = np.sqrt(np.mean(want**2))
    biased = (got.astype(np.float64) + 0.01 * rms).astype(got.dtype)
    assert not splash.compare(params, inputs, "dq", biased, want, tolerance)["passed"]
    past = got.astype(np.float64) + 3 * terms["dq_shift"] * terms["dq_direction"]
    assert not splash.compare(params, inputs, "dq", past.astype(got.dtype), want,
                              tolerance)["passed"]


def test_along_d_finds_each_rows_best_shift(rng):
    """along_d's search lands on each row's minimum of its worst element over the
    tolerance, and the verdict is that minimum's: within the bound it passes, a hair past
    it fails. The exact minimum of max_j |a_j - c b_j| over |c| <= L lies at ±L or where
    two of the lines a_j - c b_j, ±(a_k - c b_k) cross: every such c is tried."""
    rows, d = 40, 32
    want, w = rng.normal(size=(rows, d)), rng.normal(size=(rows, d))
    free = np.abs(rng.normal(size=(rows, d))) * 1e-3
    shift = np.abs(rng.normal(size=(rows, 1))) * 1e-2
    shift[:3] = 0.0  # rows D's bound allows no shift
    got = want + rng.uniform(-1.5, 1.5, (rows, 1)) * shift * w \
        + rng.uniform(-0.7, 0.7, (rows, d)) * free
    a, b = (got - want) / free, w / free
    with np.errstate(divide="ignore", invalid="ignore"):
        crossings = np.concatenate([
            ((a[:, :, None] - sign * a[:, None]) / (b[:, :, None] - sign * b[:, None]))
            .reshape(rows, -1) for sign in (1, -1)], axis=1)
    tried = np.clip(np.nan_to_num(np.concatenate([crossings, -shift, shift], axis=1)),
                    -shift, shift)
    best = np.abs(a[:, None] - tried[:, :, None] * b[:, None]).max(-1).min(1)
    for scale in (best.max() * 1.001, best.max() / 1.001):
        found = bounds.along_d(got, want, free * scale, w, shift, 0.0, 0.0)
        assert found["worst_error_over_tolerance"] == pytest.approx(best.max() / scale,
                                                                    rel=1e-8)
        assert found["passed"] == (scale > best.max())
        assert found["along_d"]["max_shift_over_bound"] <= 1.0


def test_the_power_study_holds_a_correct_forward_and_catches_its_mutants(rng):
    """benchmarks/splash_bound_power.py at a small S: the emulated correct execution
    within every bound, both 64-key mutants past every one (at S 1024 the worst case
    still sees them), the bound over v with blocked sums tighter than the worst case."""
    from benchmarks import splash_bound_power

    found = splash_bound_power.point(1024, rng)
    for bound in found["correct (emulated)"]:
        assert found["correct (emulated)"][bound] < 1
        assert found["partial_block_as_full"][bound] > 1
        assert found["last_kv_block_skipped"][bound] > 1
    assert found["partial_block_as_full"]["over v, blocked sums"] > \
        found["partial_block_as_full"]["worst case"]


def test_v_sigma_holds_for_the_cases_own_draw_only(rng):
    """The bound over v is a statement about v drawn as the case draws it; any other v
    (constant, scaled, shifted, one-signed, empty) gets the worst case alone."""
    v = splash.make_inputs(problem(), rng)["v"]
    assert bounds.v_sigma(v) == bounds.SIGMA
    wide = v.astype(np.float32)
    for other in (np.ones_like(v), wide * 3, wide + 0.5, np.abs(wide), wide[:, :0]):
        assert bounds.v_sigma(other) is None
    params = problem()
    inputs = {**splash.make_inputs(params, rng), "v": (wide * 3).astype(v.dtype)}
    heads, rows = np.zeros(8, int), np.arange(300, 308)
    seen = np.arange(params["seq_len"])[None] <= rows[:, None]
    found = bounds.rows_bound(params, inputs, heads, rows)[1]
    worst = bounds.forward_rows(inputs["q"][0, rows], inputs["k"][0], inputs["v"][0], seen,
                                None, "bfloat16")[1]
    np.testing.assert_allclose(found, worst, rtol=1e-12)


def test_the_bound_over_v_sees_a_64_key_error_3x_further_than_the_worst_case_at_s_16384(rng):
    """One head, causal, S 16384 (docs/splash-bounds.md): at the last 64 rows and 64
    drawn, a float32 online-softmax execution within the bound; the last partial mask
    block read as visible and the last 64 keys skipped past it, over 2×, and at least 3×
    as far past it as past the worst case alone (which, in 397 draws, let them through at
    a median 0.8 of it; their ratio was 3.6 or more in every draw)."""
    from benchmarks import splash_bound_power as study

    s = 16384
    params = {"heads_q": 1, "heads_kv": 1, "seq_len": s, "head_dim": 128,
              "dtype": "bfloat16", "mask": {"kind": "causal"}}
    inputs = splash.make_inputs(params, rng)
    q, k, v = (inputs[n][0].astype(np.float64) for n in ("q", "k", "v"))
    rows = np.concatenate([np.sort(rng.choice(s - 64, 64, replace=False)),
                           np.arange(s - 64, s)])
    seen = study._seen(rows, s, None)
    out, bound = bounds.forward_rows(q[rows], k, v, seen, None, "bfloat16",
                                     sigma=bounds.v_sigma(inputs["v"]))
    worst = bounds.forward_rows(q[rows], k, v, seen, None, "bfloat16")[1]
    assert (bound <= worst).all() and np.median(worst / bound) > 3

    def over(got, limit):
        return (np.abs(got - out) / (limit * (1 + 2**-8) + 2**-8 * np.abs(out))).max()

    assert over(study._emulated(q[rows], k, v, seen), bound) < 0.5
    for mutant in ("partial_block_as_full", "last_kv_block_skipped"):
        wrong = bounds.forward_rows(q[rows], k, v, study._seen(rows, s, mutant), None,
                                    "bfloat16")[0]
        wrong = wrong.astype(inputs["v"].dtype).astype(np.float64)
        assert over(wrong, bound) > max(2, 3 * over(wrong, worst)), mutant

