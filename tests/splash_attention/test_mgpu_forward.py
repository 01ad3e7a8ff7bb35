"""The Mosaic GPU port, forward: interpreted on the CPU (race detection on) against the
float64 oracle and upstream TPU splash attention, and lowered for sm_90a.

Every interpret test has a timeout: a barrier bug makes the interpreter hang.
Checks (against the float64 oracle, inputs already rounded): each element within the bound
a correct execution keeps to (kernels/splash_attention/bounds.py, the case's own check)
under the test's mask; logsumexp's tolerance is ``problems.LSE_TOLERANCE``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from casebook.core import paths
from casebook.stages.verify import compare
from kernels import mgpu_interpret, mgpu_lowering
from kernels.splash_attention import (
    block_plan,
    bounds,
    builds,
    mgpu_forward,
    oracle_f64,
    port,
    problems,
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

LSE_TOL = problems.LSE_TOLERANCE


def run_and_check(interp, mask, q, k, v, *, seg=None, cap=None, lse=False, config=None):
    config = config or mgpu_forward.TuningConfig(64, 64, 2)
    got = mgpu_forward.splash_attention(
        mask, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), segment_ids=seg, soft_cap=cap,
        return_lse=lse, config=config, interpret=interp)
    got = jax.block_until_ready(got)
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    k3, v3 = (k[None], v[None]) if k.ndim == 2 else (k, v)
    want = oracle_f64.attention(q, k3, v3, dense(mask), soft_cap=cap, return_lse=lse,
                                segment_ids=None if seg is None else (seg.q, seg.kv))
    out, want_out = (got[0], want[0]) if lse else (got, want)
    result = within_bound.check({"out": out}, {"out": want_out}, {"q": q, "k": k, "v": v},
                                dense(mask), seg=seg, cap=cap)["out"]
    assert result["passed"], result
    if lse:
        got_lse = np.asarray(got[1], np.float64)
        empty = np.isneginf(want[1])  # rows that see no key: logsumexp -inf
        np.testing.assert_array_equal(np.isneginf(got_lse), empty)
        lse_result = compare(got_lse[~empty], want[1][~empty], LSE_TOL, LSE_TOL)
        assert lse_result["passed"], lse_result
    return result


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "hq", "hkv", "dqk", "dv", "dtype"), MASK_CASES,
                         ids=MASK_CASE_IDS)
def test_forward_matches_the_oracle(rng, interpreter, kind, hq, hkv, dqk, dv, dtype):
    mask = mask_of(kind, hq, rng)
    q, k, v = inputs(rng, hq, hkv, dqk, dv, dtype)
    run_and_check(interpreter, mask, q, k, v)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["causal", "numpy"])
def test_segment_ids_soft_cap_and_logsumexp(rng, interpreter, kind):
    mask = mask_of(kind, 2, rng)
    q, k, v = inputs(rng, 2, 2, 64, 64, "float16")
    q = q * 8  # logits large enough for the soft cap to bite
    run_and_check(interpreter, mask, q, k, v, seg=segments(rng), cap=2.5, lse=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("kind", "hq", "hkv", "dims", "block_kv"), [
    ("causal", 2, 1, (64, 64), 128), ("per_head", 2, 2, (128, 64), 64),
    ("numpy", 2, 2, (64, 128), 128)])
def test_two_compute_warpgroups_and_a_producer(rng, interpreter, kind, hq, hkv, dims,
                                               block_kv):
    """The FA3-style form: 2 consumer warpgroups of 64 rows, a TMA producer, the kv ring
    handed back through consumed barriers; iota and MaskInfo-tile partial blocks."""
    mask = mask_of(kind, hq, rng)
    q, k, v = inputs(rng, hq, hkv, *dims, "bfloat16")
    q = q * 8
    run_and_check(interpreter, mask, q, k, v, seg=segments(rng), cap=3.0, lse=True,
                  config=mgpu_forward.TuningConfig(128, block_kv, 2, compute_wgs=2))


WARP_SPECIALISED_IN_A_FRESH_PROCESS = """
import os, sys
import jax, numpy as np
from kernels import mgpu_interpret
from kernels.splash_attention import mgpu_forward
from kernels.splash_attention.problems import inputs, mask_of, segments
interpret, execution = mgpu_interpret.placement("check")
rng = np.random.default_rng(int(sys.argv[1]))
q, k, v = inputs(rng, 2, 2, 64, 64, "float16")
jax.block_until_ready(mgpu_forward.splash_attention(
    mask_of("numpy", 2, rng), q, k, v, segment_ids=segments(rng), return_lse=True,
    config=mgpu_forward.TuningConfig(128, 128, 2, compute_wgs=2), interpret=interpret))
print(execution["xla_cpu_pool_workers"], os.environ.get("PJRT_NPROC"))
"""


@pytest.mark.timeout(300)
def test_a_pipeline_process_interprets_three_warpgroups_without_starving(rng):
    """As verify and time run it: a fresh process whose first JAX call is ``placement``.
    On a 2-core host XLA's default pool (2 workers) hung this kernel (numpy mask, segment
    ids, logsumexp) in 2 of 3 runs; the process gets >= 4 workers, its children do not."""
    env = {k: v for k, v in os.environ.items() if k != mgpu_interpret.POOL_VARIABLE}
    env["PYTHONPATH"] = str(paths.SOURCE_ROOT)
    found = subprocess.run(
        [sys.executable, "-c", WARP_SPECIALISED_IN_A_FRESH_PROCESS,
         str(rng.integers(2**32))], env=env, capture_output=True, text=True, timeout=240)
    assert found.returncode == 0, found.stderr[-2000:]
    workers, variable = found.stdout.split()
    assert int(workers) >= mgpu_interpret.MIN_POOL_WORKERS and variable == "None"


@pytest.mark.timeout(300)
def test_a_second_call_compiles_nothing(rng, interpreter):
    """The interpreter runs each of the 3 warpgroups of each CTA as its own XLA
    computation; jax 0.10.2 compiled each again on every call (12 compilations of
    1.3-1.8 s for this kernel) until ``cache_thread_bodies``. Fresh inputs each call, both
    checked against the oracle."""
    from jax import monitoring

    mask = mask_of("causal", 2, rng, 256)
    problem = mgpu_forward.Problem(2, 2, 256, 256, 64, 64, "float16")
    forward = jax.jit(mgpu_forward.make(
        problem, mgpu_forward.TuningConfig(128, 64, 2, compute_wgs=2),
        block_plan.plan(mask, 128, 64), interpret=interpreter))
    compiled = []

    def count(event, seconds, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(seconds)

    monitoring.register_event_duration_secs_listener(count)
    try:
        for call in range(2):
            q, k, v = inputs(rng, 2, 2, 64, 64, "float16", 256)
            before = len(compiled)
            got = jax.block_until_ready(forward(jnp.asarray(q), jnp.swapaxes(k, 1, 2), v))
            want = oracle_f64.attention(q, k, v, dense(mask))
            assert within_bound.check({"out": got}, {"out": want}, {"q": q, "k": k, "v": v},
                                      dense(mask))["out"]["passed"]
            assert call == 0 or len(compiled) == before, (
                f"call {call} compiled {len(compiled) - before} computations")
    finally:
        from jax._src import monitoring as monitoring_state
        monitoring_state.unregister_event_duration_listener(count)
    assert compiled, "the first call compiled nothing: the listener saw no compilation"
    assert not mgpu_interpret.races_found()


def test_too_few_host_workers_is_refused_not_hung(rng, monkeypatch):
    monkeypatch.setattr(mgpu_interpret, "_pool_workers", 2)
    mask = mask_of("causal", 1, rng)
    problem = mgpu_forward.Problem(1, 1, S, S, 64, 64, "float16")
    with pytest.raises(RuntimeError, match="needs 3 XLA CPU workers"):
        mgpu_forward.make(problem, mgpu_forward.TuningConfig(128, 64, 2, compute_wgs=2),
                          block_plan.plan(mask, 128, 64),
                          interpret=mgpu_interpret.interpret_params())


@pytest.mark.timeout(240)
def test_mqa_with_dims_up_to_256_and_a_deeper_ring(rng, interpreter):
    mask = mask_of("causal", 2, rng)
    q, k, v = inputs(rng, 2, 1, 256, 256, "bfloat16")
    run_and_check(interpreter, mask, q, k[0], v[0],
                  config=mgpu_forward.TuningConfig(block_q=64, block_kv=64, stages=3))


@pytest.mark.timeout(240)
def test_a_row_that_sees_no_key_gives_zero(rng, interpreter):
    dense_mask = np.tril(np.ones((S, S), bool))
    dense_mask[70] = False  # q row 70 attends to nothing
    mask = splash.MultiHeadMask([splash.NumpyMask(dense_mask)])
    q, k, v = inputs(rng, 1, 1, 64, 64, "float16")
    run_and_check(interpreter, mask, q, k, v, lse=True)


@pytest.mark.timeout(300)
def test_matches_upstream_tpu_splash_in_interpret_mode(rng, interpreter):
    """Same inputs through both kernels: upstream's own answer, not only the oracle's;
    each within the bound, so the two within the sum of theirs."""
    mask = mask_of("combined", 2, rng)
    q, k, v = inputs(rng, 2, 2, 64, 64, "bfloat16")
    seg = segments(rng)
    theirs = splash.make_splash_mha_single_device(
        mask, block_sizes=splash.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128),
        attn_logits_soft_cap=3.0, interpret=True)(q, k, v, segment_ids=seg)
    ours = mgpu_forward.splash_attention(
        mask, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), segment_ids=seg, soft_cap=3.0,
        config=mgpu_forward.TuningConfig(64, 64, 2), interpret=interpreter)
    assert not mgpu_interpret.races_found()
    want = oracle_f64.attention(q, k, v, dense(mask), soft_cap=3.0,
                                segment_ids=(seg.q, seg.kv))
    operands = {"q": q, "k": k, "v": v}
    for got in (ours, theirs):
        result = within_bound.check({"out": got}, {"out": want}, operands, dense(mask),
                                    seg=seg, cap=3.0)["out"]
        assert result["passed"], result
    allowed = bounds.dense_bounds(operands, within_bound.visible(dense(mask), seg), 3.0,
                                  "bfloat16")["out_bound"] + bounds.UNIT["bfloat16"] * np.abs(want)
    assert np.all(np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))
                  <= 2 * allowed)


@pytest.mark.timeout(600)
@settings(max_examples=4, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(MASK_KINDS),
       layout=st.sampled_from([(2, 2), (2, 1), (4, 2)]),
       dims=st.sampled_from([(64, 64), (128, 64), (64, 128)]),
       dtype=st.sampled_from(["float16", "bfloat16"]),
       cap=st.sampled_from([None, 4.0]), with_segments=st.booleans(), lse=st.booleans(),
       block_kv=st.sampled_from([64, 128]), wgs=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**32 - 1))
def test_fuzz_forward(interpreter, kind, layout, dims, dtype, cap, with_segments, lse,
                      block_kv, wgs, seed):
    """A bounded randomized sweep (4 examples per CI run, fresh each run)."""
    rng = np.random.default_rng(seed)
    mask = mask_of(kind, layout[0], rng)
    q, k, v = inputs(rng, *layout, *dims, dtype)
    seg = segments(rng) if with_segments else None
    run_and_check(interpreter, mask, q, k, v, seg=seg, cap=cap, lse=lse,
                  config=mgpu_forward.TuningConfig(64 * wgs, block_kv, 2, compute_wgs=wgs))


def test_the_block_plan_rebuilds_every_mask_and_skips_empty_blocks(rng):
    for kind in ("causal", "local", "chunked", "numpy", "combined", "per_head"):
        mask = mask_of(kind, 2, rng)
        plan = block_plan.plan(mask, 64, 128)
        rebuilt = np.zeros((2, S, S), bool)
        for h in range(2):
            p = h if plan.mask_heads > 1 else 0
            for i in range(S // 64):
                for t in range(plan.count[p, i]):
                    j = plan.kv_block[p, i, t]
                    assert plan.kind[p, i, t] in (block_plan.PARTIAL, block_plan.FULL)
                    if plan.kind[p, i, t] == block_plan.FULL:
                        tile = True
                    elif plan.mask_function is not None:
                        rows = np.arange(i * 64, (i + 1) * 64)[:, None]
                        cols = np.arange(j * 128, (j + 1) * 128)[None, :]
                        tile = plan.mask_function(rows, cols)
                    else:
                        tile = plan.partial_blocks[plan.mask_block[p, i, t]]
                    rebuilt[h, i * 64:(i + 1) * 64, j * 128:(j + 1) * 128] = tile
        np.testing.assert_array_equal(rebuilt, dense(mask), err_msg=kind)
        assert plan.count.sum() == (plan.classes != block_plan.EMPTY).sum()


@pytest.mark.parametrize("bad", [dict(block_q=96), dict(block_kv=100), dict(stages=0),
                                 dict(block_kv=512), dict(compute_wgs=3),
                                 dict(compute_wgs=2, block_q=64)])
def test_bad_tuning_is_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        mgpu_forward.TuningConfig(**bad)


@pytest.mark.timeout(120)
def test_two_compute_warpgroups_lower_with_a_producer_warpgroup():
    params = {"heads_q": 16, "heads_kv": 16, "seq_len": 4096, "head_dim": 128,
              "mask": {"kind": "causal"}, "dtype": "bfloat16",
              "tiles": {"block_q": 128, "block_kv": 128, "stages": 2, "compute_wgs": 2}}
    facts = builds.build("mgpu", params)["artifacts"][0]["facts"]
    assert facts["grid"] == [4096 // 128, 16, 1]
    assert facts["block"] == [384, 1, 1]  # 2 consumer warpgroups + 1 producer
    assert facts["dynamic_smem_bytes"] <= mgpu_forward.SMEM_LIMIT_BYTES


def test_bad_problems_are_refused():
    with pytest.raises(ValueError, match="dtype"):
        mgpu_forward.Problem(1, 1, 128, 128, 64, 64, "float32")
    with pytest.raises(ValueError, match="head_dim_v"):
        mgpu_forward.Problem(1, 1, 128, 128, 64, 96, "float16")
    with pytest.raises(ValueError, match="heads_q"):
        mgpu_forward.Problem(3, 2, 128, 128, 64, 64, "float16")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", port.FORWARD_VARIANTS)
@pytest.mark.parametrize(("seq_len", "head_dim", "mask"), [
    (4096, 256, {"kind": "causal"}), (32768, 64, {"kind": "local", "window": [4096, 0]})])
def test_publishable_sizes_lower_for_sm90a_within_shared_memory(variant, seq_len, head_dim,
                                                                 mask):
    params = {"heads_q": 16, "heads_kv": 16, "seq_len": seq_len, "head_dim": head_dim,
              "mask": mask, "dtype": "bfloat16"}
    built = builds.build(variant, params)
    facts = built["artifacts"][0]["facts"]
    config = port.tuning(params)
    assert facts["grid"] == [seq_len // config.block_q, 16, 1]
    assert facts["block"] == [128, 1, 1]  # one warpgroup
    # What the compiler allocated covers what the kernel asked for, within the limit.
    asked = mgpu_forward.smem_bytes(port.problem(params), config,
                                    variant == "mgpu_mask_tiles")
    assert asked <= facts["dynamic_smem_bytes"] <= mgpu_forward.SMEM_LIMIT_BYTES
    assert built["block_census"]["empty"] > 0


@pytest.mark.timeout(120)
def test_an_over_budget_configuration_fails_naming_it():
    params = {"heads_q": 1, "heads_kv": 1, "seq_len": 1024, "head_dim": 256,
              "mask": {"kind": "causal"}, "dtype": "float16",
              "tiles": {"block_q": 128, "block_kv": 128, "stages": 3}}
    with pytest.raises(ValueError, match=r"exceed the 232448-byte limit.*block_q=128"):
        builds.build("mgpu", params)


@pytest.mark.timeout(120)
def test_the_launch_facts_come_from_the_lowered_module():
    """Two configurations that differ only in ring depth differ in allocated memory."""
    params = {"heads_q": 2, "heads_kv": 2, "seq_len": 512, "head_dim": 64,
              "mask": {"kind": "causal"}, "dtype": "float16"}
    smem = []
    for stages in (1, 2):
        tiles = {"block_q": 64, "block_kv": 64, "stages": stages}
        fn = port.make("mgpu", {**params, "tiles": tiles})
        (launch,) = mgpu_lowering.lower_for_cuda(fn, builds.arg_shapes(params))["launches"]
        smem.append(launch["dynamic_smem_bytes"])
    per_stage = (64 * 64 + 64 * 64) * 2  # one K^T tile and one V tile, f16
    assert smem[1] - smem[0] >= per_stage


def test_the_default_tiles_take_the_widest_block_kv_that_fits():
    params = {"heads_q": 16, "heads_kv": 16, "seq_len": 4096, "mask": {"kind": "causal"},
              "dtype": "bfloat16"}
    for head_dim, block_kv in ((128, 128), (256, 64)):
        config = port.tuning({**params, "head_dim": head_dim})
        assert config.block_kv == block_kv
        problem = port.problem({**params, "head_dim": head_dim})
        assert mgpu_forward.smem_bytes(problem, config, True) <= mgpu_forward.SMEM_LIMIT_BYTES
    wider = mgpu_forward.TuningConfig(64, 128, 2)
    assert mgpu_forward.smem_bytes(port.problem({**params, "head_dim": 256}), wider,
                                   True) > mgpu_forward.SMEM_LIMIT_BYTES
