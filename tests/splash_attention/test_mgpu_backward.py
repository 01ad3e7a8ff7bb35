"""The Mosaic GPU port, backward: jax.vjp through the port (forward kernel + dQ and dK/dV
kernels, joined by a custom VJP) in the interpreter with race detection and NaN shared
memory, against float64 autodiff of the dense reference and upstream's own backward;
lowered for sm_90a.

Checks for out, dq, dk and dv: each element within the bound a correct execution keeps to
(kernels/splash_attention/bounds.py, the case's own check) under the test's mask.
Every interpret test has a timeout: a barrier bug makes the interpreter hang.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from kernels import mgpu_interpret, mgpu_lowering
from kernels.splash_attention import (
    block_plan,
    bounds,
    builds,
    mgpu_autodiff,
    mgpu_backward,
    mgpu_forward,
    oracle_vjp,
    port,
)
from kernels.splash_attention.problems import (
    MASK_CASE_IDS,
    MASK_CASES,
    MASK_KINDS,
    S,
    dense,
    inputs,
    mask_of,
    segments,
)
from tests.splash_attention import within_bound

pytestmark = [pytest.mark.interpret, pytest.mark.compile, pytest.mark.host_rehearsal]

FWD = mgpu_forward.TuningConfig(64, 64, 2)
BWD = mgpu_backward.BackwardConfig(64, 64, 2)


def cotangent(rng, q, dv):
    """dO with dO·Vᵀ at unit scale, as q's 1/sqrt(D) gives Q·Kᵀ (see problems.inputs)."""
    return (rng.standard_normal((q.shape[0], q.shape[1], dv)) / np.sqrt(dv)).astype(q.dtype)


def port_vjp(interp, mask, q, k, v, do, *, seg=None, cap=None, bwd=BWD):
    def attend(q, k, v):
        return mgpu_autodiff.splash_attention(mask, q, k, v, segment_ids=seg, soft_cap=cap,
                                              config=FWD, bwd_config=bwd, interpret=interp)
    out, vjp = jax.vjp(attend, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    return jax.block_until_ready((out, *vjp(jnp.asarray(do))))


def check_gradients(got, want, operands, mask, *, seg=None, cap=None) -> dict:
    """out, dq, dk, dv (``got``, ``want`` in that order) within their bounds."""
    names = ("out", "dq", "dk", "dv")
    return within_bound.check(dict(zip(names, got, strict=True)),
                              dict(zip(names, want, strict=True)), operands, mask,
                              seg=seg, cap=cap)


def run_and_check(interp, rng, mask, q, k, v, *, seg=None, cap=None, bwd=BWD):
    do = cotangent(rng, q, v.shape[-1])
    got = port_vjp(interp, mask, q, k, v, do, seg=seg, cap=cap, bwd=bwd)
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    want = oracle_vjp.gradients(q, k, v, do, dense(mask), soft_cap=cap,
                                   segment_ids=None if seg is None else (seg.q, seg.kv))
    results = check_gradients(got, want, {"q": q, "k": k, "v": v, "do": do}, dense(mask),
                              seg=seg, cap=cap)
    assert all(r["passed"] for r in results.values()), results
    return results


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "hq", "hkv", "dqk", "dv", "dtype"), MASK_CASES,
                         ids=MASK_CASE_IDS)
def test_gradients_match_float64_autodiff(rng, interpreter, kind, hq, hkv, dqk, dv, dtype):
    mask = mask_of(kind, hq, rng)
    run_and_check(interpreter, rng, mask, *inputs(rng, hq, hkv, dqk, dv, dtype))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["causal", "numpy"])
def test_gradients_with_segment_ids_and_soft_cap(rng, interpreter, kind):
    mask = mask_of(kind, 2, rng)
    q, k, v = inputs(rng, 2, 1, 64, 64, "bfloat16")
    run_and_check(interpreter, rng, mask, q * 8, k, v, seg=segments(rng), cap=2.5)


@pytest.mark.timeout(300)
def test_mqa_gradients_with_unequal_dims_up_to_256(rng, interpreter):
    """MQA: one K/V for every query head, dk/dv summed over all of them; Dqk 256, Dv 128."""
    mask = mask_of("local", 2, rng)
    q, k, v = inputs(rng, 2, 1, 256, 128, "float16")
    results = run_and_check(interpreter, rng, mask, q, k[0], v[0],
                            bwd=mgpu_backward.BackwardConfig(64, 64, 1))
    assert results["dk"]["max_abs_error"] is not None


@pytest.mark.timeout(240)
def test_a_row_that_sees_no_key_gets_zero_gradient(rng, interpreter):
    dense_mask = np.tril(np.ones((S, S), bool))
    dense_mask[70] = False
    mask = splash.MultiHeadMask([splash.NumpyMask(dense_mask)])
    q, k, v = inputs(rng, 1, 1, 64, 64, "float16")
    do = cotangent(rng, q, 64)
    got = port_vjp(interpreter, mask, q, k, v, do, bwd=mgpu_backward.BackwardConfig(128, 64, 2))
    assert not mgpu_interpret.races_found()
    results = check_gradients(got, oracle_vjp.gradients(q, k, v, do, dense_mask),
                              {"q": q, "k": k, "v": v, "do": do}, dense_mask)
    assert all(r["passed"] for r in results.values()), results
    assert np.all(np.asarray(got[1])[0, 70] == 0)


@pytest.mark.timeout(300)
def test_gradients_match_upstream_tpu_splash_backward_in_interpret_mode(rng, interpreter):
    """Same inputs and cotangent through both ports' VJPs: upstream's own gradients; each
    within the bound, so the two within the sum of theirs."""
    mask = mask_of("combined", 2, rng)
    q, k, v = inputs(rng, 2, 2, 64, 64, "bfloat16")
    seg = segments(rng)
    do = cotangent(rng, q, 64)
    sizes = splash.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128,
                              block_q_dkv=128, block_kv_dkv=128, block_kv_dkv_compute=128,
                              block_q_dq=128, block_kv_dq=128)
    kernel = splash.make_splash_mha_single_device(mask, block_sizes=sizes,
                                                  attn_logits_soft_cap=3.0, interpret=True)
    theirs_out, theirs_vjp = jax.vjp(lambda q, k, v: kernel(q, k, v, segment_ids=seg),
                                     jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    theirs = (theirs_out, *theirs_vjp(jnp.asarray(do)))
    ours = port_vjp(interpreter, mask, q, k, v, do, seg=seg, cap=3.0)
    assert not mgpu_interpret.races_found()
    want = oracle_vjp.gradients(q, k, v, do, dense(mask), soft_cap=3.0,
                                segment_ids=(seg.q, seg.kv))
    operands = {"q": q, "k": k, "v": v, "do": do}
    for got in (ours, theirs):
        results = check_gradients(got, want, operands, dense(mask), seg=seg, cap=3.0)
        assert all(r["passed"] for r in results.values()), results
    found = bounds.dense_bounds(operands, within_bound.visible(dense(mask), seg), 3.0,
                                "bfloat16")
    for name, a, b, w in zip(("out", "dq", "dk", "dv"), ours, theirs, want, strict=True):
        allowed = found[f"{name}_bound"] + bounds.UNIT["bfloat16"] * np.abs(w)
        assert np.all(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
                      <= 2 * allowed), name


@pytest.mark.timeout(240)
def test_a_wrong_block_table_is_caught(rng, interpreter):
    """Mutation check: the dkv walk told a partial block is full (its mask dropped) must
    fail the gradient check; the correct walk on the same inputs passes."""
    mask = mask_of("causal", 1, rng)
    q, k, v = inputs(rng, 1, 1, 64, 64, "float16")
    do = cotangent(rng, q, 64)
    config = mgpu_backward.BackwardConfig()
    problem = mgpu_forward.Problem(1, 1, S, S, 64, 64, "float16", return_lse=True)
    forward = mgpu_forward.make(problem, FWD, block_plan.plan(mask, 64, 64),
                                interpret=interpreter)
    out, lse = forward(jnp.asarray(q), jnp.asarray(np.swapaxes(k, 1, 2)), jnp.asarray(v))
    dq_plan = block_plan.plan(mask, 64, 64)
    dkv_plan = block_plan.plan_dkv(mask, 64, 64, 1)
    wrong = dataclasses.replace(dkv_plan, kind=np.where(dkv_plan.kind == block_plan.PARTIAL,
                                                        block_plan.FULL, dkv_plan.kind))
    want = oracle_vjp.gradients(q, k, v, do, dense(mask))
    verdicts = []
    for plan in (dkv_plan, wrong):
        grads = mgpu_backward.make(problem, config, dq_plan, plan, interpret=interpreter)(
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), out, lse, jnp.asarray(do))
        verdicts.append(within_bound.check(
            {"dk": grads[1]}, {"dk": want[2]}, {"q": q, "k": k, "v": v, "do": do},
            dense(mask))["dk"]["passed"])
    assert verdicts == [True, False]


@pytest.mark.timeout(600)
@settings(max_examples=3, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(MASK_KINDS),
       layout=st.sampled_from([(2, 2), (2, 1), (4, 2)]),
       dims=st.sampled_from([(64, 64), (128, 64), (64, 128)]),
       dtype=st.sampled_from(["float16", "bfloat16"]),
       cap=st.sampled_from([None, 4.0]), with_segments=st.booleans(),
       blocks=st.sampled_from([(64, 64), (128, 64), (64, 128)]),
       stages=st.sampled_from([1, 2]), seed=st.integers(0, 2**32 - 1))
def test_fuzz_gradients(interpreter, kind, layout, dims, dtype, cap, with_segments, blocks,
                        stages, seed):
    """A bounded randomized sweep of the backward (3 examples per CI run, fresh each run)."""
    rng = np.random.default_rng(seed)
    mask = mask_of(kind, layout[0], rng)
    q, k, v = inputs(rng, *layout, *dims, dtype)
    seg = segments(rng) if with_segments else None
    run_and_check(interpreter, rng, mask, q, k, v, seg=seg, cap=cap,
                  bwd=mgpu_backward.BackwardConfig(*blocks, stages))


def test_the_dkv_plan_rebuilds_every_mask_per_kv_head(rng):
    """Upstream's dkv MaskInfo, walked per (kv head, kv block) over the group's heads,
    covers exactly the visible entries; transposed partial tiles come back transposed."""
    for kind in ("causal", "local", "numpy", "combined", "per_head"):
        for hq, hkv in ((2, 2), (4, 2), (2, 1)):
            mask = mask_of(kind, hq, rng)
            bq, bkv = 64, 128
            plan = block_plan.plan_dkv(mask, bq, bkv, hkv)
            group = hq // hkv
            rebuilt = np.zeros((hq, S, S), bool)
            for kv_head in range(hkv):
                p = kv_head if plan.plan_heads > 1 else 0
                for j in range(S // bkv):
                    for u in range(plan.count[p, j]):
                        h = kv_head * group + plan.head_offset[p, j, u]
                        i = plan.q_block[p, j, u]
                        if plan.kind[p, j, u] == block_plan.FULL:
                            tile = True
                        elif plan.mask_function is not None:
                            tile = plan.mask_function(np.arange(i * bq, (i + 1) * bq)[:, None],
                                                      np.arange(j * bkv, (j + 1) * bkv)[None])
                        else:
                            tile = plan.partial_blocks[plan.mask_block[p, j, u]].T
                        rebuilt[h, i * bq:(i + 1) * bq, j * bkv:(j + 1) * bkv] = tile
            np.testing.assert_array_equal(rebuilt, dense(mask), err_msg=f"{kind} {hq}x{hkv}")


@pytest.mark.parametrize("bad", [dict(block_q=96), dict(block_kv=256), dict(stages=0)])
def test_bad_backward_tuning_is_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        mgpu_backward.BackwardConfig(**bad)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("seq_len", "head_dim", "stages", "window"), [
    (4096, 128, 2, None), (4096, 256, 1, None), (32768, 64, 2, (4096, 0))])
def test_backward_lowers_for_sm90a_at_publishable_sizes(seq_len, head_dim, stages, window):
    heads = 16
    shape = (seq_len, seq_len)
    head_mask = splash.CausalMask(shape) if window is None else splash.LocalMask(
        shape, window, offset=0)
    mask = splash.MultiHeadMask([head_mask] * heads)
    config = mgpu_backward.BackwardConfig(64, 64, stages)
    problem = mgpu_forward.Problem(heads, heads, seq_len, seq_len, head_dim, head_dim,
                                   "bfloat16")
    fn = mgpu_backward.make(problem, config, block_plan.plan(mask, 64, 64),
                            block_plan.plan_dkv(mask, 64, 64, heads))
    arg = jax.ShapeDtypeStruct((heads, seq_len, head_dim), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((heads, seq_len), jnp.float32)
    dq_launch, dkv_launch = mgpu_lowering.lower_for_cuda(fn, [arg, arg, arg, arg, lse, arg])[
        "launches"]
    asked = mgpu_backward.smem_bytes(problem, config, False)
    for launch, name in ((dq_launch, "dq"), (dkv_launch, "dkv")):
        assert launch["grid"] == [seq_len // 64, heads, 1]
        assert launch["block"] == [128, 1, 1]
        assert asked[name] <= launch["dynamic_smem_bytes"] <= mgpu_forward.SMEM_LIMIT_BYTES



def test_an_over_budget_backward_fails_the_build_naming_it():
    params = {"heads_q": 1, "heads_kv": 1, "seq_len": 1024, "head_dim": 256,
              "mask": {"kind": "causal"}, "dtype": "bfloat16",
              "bwd_tiles": {"block_q": 128, "block_kv": 128, "stages": 2}}
    with pytest.raises(ValueError, match=r"mgpu_bwd \(dq kernel\).*exceed the 232448-byte "
                                         r"limit.*block_q=128"):
        builds.build("mgpu_bwd", params)


def test_the_default_backward_tiles_fit_every_head_dim():
    for head_dim, stages in ((64, 2), (128, 2), (256, 1)):
        params = {"heads_q": 16, "heads_kv": 16, "seq_len": 4096, "head_dim": head_dim,
                  "mask": {"kind": "causal"}, "dtype": "bfloat16", "segments": 4}
        config = port.backward_tuning(params)
        assert config.stages == stages
        assert max(mgpu_backward.smem_bytes(port.problem(params), config, False).values()) \
            <= mgpu_forward.SMEM_LIMIT_BYTES


def _bad(q, k, v, seg):
    """Each bad input the reviewer found, and one of each kind besides."""
    return {
        "q f16, k and v bf16": (q, k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), None,
                                r"q, k, v: dtypes float16, bfloat16, bfloat16; need one dtype"),
        "head dims 64 vs 128": (q, jnp.concatenate([k, k], axis=2), v, None,
                                r"k: head dim 128; needs q's head dim 64"),
        "segment ids too short": (q, k, v, splash.SegmentIds(q=seg.q[:64], kv=seg.kv),
                                  r"segment_ids\.q: shape \(64,\); needs \(128,\)"),
        "segment ids not integers": (q, k, v, splash.SegmentIds(
            q=seg.q.astype(np.float32), kv=seg.kv), r"segment_ids\.q: dtype float32"),
        "v of another length": (q, k, v[:, :64], None, r"v: \(2, 64, 64\); needs k's heads"),
        "k MQA, v MHA": (q, k[0], v, None, r"k and v: \(128, 64\) and \(2, 128, 64\)"),
    }


BAD = ["q f16, k and v bf16", "head dims 64 vs 128", "segment ids too short",
       "segment ids not integers", "v of another length", "k MQA, v MHA"]


@pytest.mark.parametrize("entry", ["forward", "vjp"])
@pytest.mark.parametrize("case", BAD)
def test_a_bad_input_is_named_before_anything_is_traced(rng, entry, case):
    """One ValueError naming the argument, what it got and what it needs."""
    q, k, v = (jnp.asarray(x) for x in inputs(rng, 2, 2, 64, 64, "float16", s=128))
    q, k, v, segment_ids, message = _bad(q, k, v, segments(rng, s=128))[case]
    mask = mask_of("causal", 2, rng, s=128)
    call = mgpu_forward.splash_attention if entry == "forward" else \
        mgpu_autodiff.splash_attention
    with pytest.raises(ValueError, match=message):
        call(mask, q, k, v, segment_ids=segment_ids, interpret=None)


# The backward entries, each made for one problem (GQA, Dqk != Dv, segment ids).
HQ, HKV, SQ, DQK, DV = 2, 1, 128, 64, 128
SEGMENTED = mgpu_forward.Problem(HQ, HKV, SQ, SQ, DQK, DV, "float16", segment_ids=True)
UNSEGMENTED = dataclasses.replace(SEGMENTED, segment_ids=False)
BACKWARD_ENTRIES = ["make", "make_dq", "make_dkv"]


@pytest.fixture
def launches(monkeypatch):
    """Each backward kernel replaced by one that records its launch (its grid's second
    axis) and returns zeros of its outputs: the checks run, nothing is traced."""
    calls = []

    def kernel(body, *, out_type, grid_names, **_):
        def launch(*args):
            calls.append(grid_names[1])
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_type)
        return launch

    monkeypatch.setattr(mgpu_backward.plgpu, "kernel", kernel)
    return calls


def backward_entry(entry, problem=SEGMENTED):
    """``entry`` made for ``problem``, and good arguments for it by name."""
    mask = mask_of("causal", HQ, None, s=SQ)
    q, do = jnp.zeros((HQ, SQ, DQK), jnp.float16), jnp.zeros((HQ, SQ, DV), jnp.float16)
    k, v = jnp.zeros((HKV, SQ, DQK), jnp.float16), jnp.zeros((HKV, SQ, DV), jnp.float16)
    rows = jnp.zeros((HQ, SQ), jnp.float32)
    segs = {"q_seg": jnp.zeros(SQ, jnp.int32), "kv_seg": jnp.zeros(SQ, jnp.int32)}
    segs = segs if problem.segment_ids else {}
    dq_plan, dkv_plan = block_plan.plan(mask, 64, 64), block_plan.plan_dkv(mask, 64, 64, HKV)
    if entry == "make":
        return (mgpu_backward.make(problem, BWD, dq_plan, dkv_plan),
                {"q": q, "k": k, "v": v, "out": do, "lse": rows, "do": do, **segs})
    t = functools.partial(jnp.swapaxes, axis1=1, axis2=2)
    if entry == "make_dq":
        return (mgpu_backward.make_dq(problem, BWD, dq_plan),
                {"q": q, "k": k, "k_t": t(k), "v_t": t(v), "do": do, "lse2": rows,
                 "delta": rows, **segs})
    return (mgpu_backward.make_dkv(problem, BWD, dkv_plan),
            {"q": q, "q_t": t(q), "k": k, "v": v, "do": do, "do_t": t(do), "lse2": rows,
             "delta": rows, **segs})


# label: (argument, change, error, message after "<argument>: "); "lse" stands for lse2
# at the kernels' own entries.
BAD_BACKWARD = {
    "wrong dtype": ("q", lambda x: x.astype(jnp.float32), ValueError,
                    r"dtype float32; needs float16$"),
    "mixed dtypes": ("k", lambda x: x.astype(jnp.bfloat16), ValueError,
                     r"dtype bfloat16; needs float16$"),
    "wrong head dim": ("q", lambda x: jnp.concatenate([x, x], axis=2), ValueError,
                       r"shape \(2, 128, 128\); needs \(heads_q, seq_q, head_dim_qk\) = "
                       r"\(2, 128, 64\)$"),
    "wrong head count": ("k", lambda x: jnp.concatenate([x, x]), ValueError,
                         r"shape \(2, 128, 64\); needs \(heads_kv, seq_kv, head_dim_qk\) = "
                         r"\(1, 128, 64\)$"),
    "wrong seq len": ("k", lambda x: x[:, :64], ValueError,
                      r"shape \(1, 64, 64\); needs \(heads_kv, seq_kv, head_dim_qk\)"),
    "wrong lse shape": ("lse", lambda x: x[0], ValueError,
                        r"shape \(128,\); needs \(heads_q, seq_q\) = \(2, 128\)$"),
    "wrong lse dtype": ("lse", lambda x: x.astype(jnp.float16), ValueError,
                        r"dtype float16; needs float32$"),
    "lse not an array": ("lse", lambda x: x.tolist(), TypeError, r"list; needs an array$"),
    "segment ids too short": ("q_seg", lambda x: x[:64], ValueError,
                              r"shape \(64,\); needs \(128,\)$"),
    "segment ids not integers": ("kv_seg", lambda x: x.astype(jnp.float32), ValueError,
                                 r"dtype float32; needs integers$"),
    "segment ids missing": ("kv_seg", lambda x: None, ValueError,
                            r"None; needs \(128,\) integers"),
}


@pytest.mark.parametrize("entry", BACKWARD_ENTRIES)
@pytest.mark.parametrize("case", list(BAD_BACKWARD))
def test_a_bad_backward_argument_is_named_before_anything_is_traced(launches, entry, case):
    """One line naming the argument, what it got and what it needs; no kernel launched."""
    call, args = backward_entry(entry)
    name, change, error, message = BAD_BACKWARD[case]
    if name == "lse" and entry != "make":
        name = "lse2"
    args[name] = change(args[name])
    with pytest.raises(error, match=rf"^{name}: {message}") as raised:
        call(**args)
    assert "\n" not in str(raised.value)
    assert launches == []


@pytest.mark.parametrize("entry", BACKWARD_ENTRIES)
def test_segment_ids_for_a_problem_without_them_are_refused(launches, entry):
    call, args = backward_entry(entry, UNSEGMENTED)
    with pytest.raises(ValueError, match=r"^q_seg: given; needs None"):
        call(**args, q_seg=np.zeros(SQ, np.int32), kv_seg=np.zeros(SQ, np.int32))
    assert launches == []


@pytest.mark.parametrize("problem", [SEGMENTED, UNSEGMENTED], ids=["segments", "none"])
@pytest.mark.parametrize("entry", BACKWARD_ENTRIES)
def test_good_backward_arguments_reach_the_kernels(launches, entry, problem):
    call, args = backward_entry(entry, problem)
    call(**args)
    assert launches == {"make": ["q_blocks", "kv_blocks"], "make_dq": ["q_blocks"],
                        "make_dkv": ["kv_blocks"]}[entry]
