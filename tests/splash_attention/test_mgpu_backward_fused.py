"""The port's backward in one kernel (``mgpu_backward_fused``): dQ, dK and dV from one
launch, dQ summed by a partitioned reduction, in the interpreter with race detection
and NaN shared memory against float64 autodiff of the dense reference; lowered for
sm_90a at the publishable sizes with its budget.

Tolerances: the case config's, as for the two-kernel backward (test_mgpu_backward.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import mgpu_interpret
from kernels.splash_attention import (
    block_plan,
    builds,
    mgpu_autodiff,
    mgpu_backward,
    mgpu_backward_fused,
    mgpu_forward,
    oracle_vjp,
    port,
)
from kernels.splash_attention.problems import (
    MASK_CASE_IDS,
    MASK_CASES,
    dense,
    inputs,
    mask_of,
    segments,
)
from tests.splash_attention.test_mgpu_backward import FWD, check_gradients, cotangent

pytestmark = [pytest.mark.interpret, pytest.mark.compile]
TILES = mgpu_backward.BackwardConfig(64, 64, 2)


def fused_vjp(interp, mask, q, k, v, do, *, partitions, seg=None, cap=None):
    problem = mgpu_forward.Problem(q.shape[0], k.shape[0], q.shape[1], k.shape[1],
                                   q.shape[2], v.shape[2], q.dtype.name, soft_cap=cap,
                                   segment_ids=seg is not None, return_lse=True)
    forward = mgpu_forward.make(problem, FWD, block_plan.plan(mask, 64, 64), interpret=interp)
    backward = mgpu_backward_fused.make(
        problem, mgpu_backward_fused.FusedBackwardConfig(TILES, partitions),
        block_plan.plan_dkv(mask, 64, 64, k.shape[0]), interpret=interp)
    segs = () if seg is None else (jnp.asarray(seg.q), jnp.asarray(seg.kv))
    attend = mgpu_autodiff.joined(forward, backward, segs)
    out, vjp = jax.vjp(attend, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    return jax.block_until_ready((out, *vjp(jnp.asarray(do))))


def run_and_check(interp, rng, mask, q, k, v, *, partitions, seg=None, cap=None):
    do = cotangent(rng, q, v.shape[-1])
    got = fused_vjp(interp, mask, q, k, v, do, partitions=partitions, seg=seg, cap=cap)
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    want = oracle_vjp.gradients(q, k, v, do, dense(mask), soft_cap=cap,
                                segment_ids=None if seg is None else (seg.q, seg.kv))
    results = check_gradients(got, want, {"q": q, "k": k, "v": v, "do": do}, dense(mask),
                              seg=seg, cap=cap)
    assert all(r["passed"] for r in results.values()), results


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "hq", "hkv", "dqk", "dv", "dtype"), MASK_CASES,
                         ids=MASK_CASE_IDS)
def test_gradients_match_float64_autodiff(rng, interpreter, kind, hq, hkv, dqk, dv, dtype):
    """Two partitions: each CTA owns two of the four kv blocks and adds its second
    block's dQ share to its first's; every mask kind (partial tiles too), head layout."""
    mask = mask_of(kind, hq, rng)
    run_and_check(interpreter, rng, mask, *inputs(rng, hq, hkv, dqk, dv, dtype), partitions=2)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_any_partition_count_sums_the_same_gradients(rng, interpreter, partitions):
    """One CTA per kv head walking every kv block, an uneven split, one kv block each;
    with segment ids and a soft cap."""
    mask = mask_of("causal", 2, rng)
    q, k, v = inputs(rng, 2, 1, 64, 64, "bfloat16")
    run_and_check(interpreter, rng, mask, q * 8, k, v, partitions=partitions,
                  seg=segments(rng), cap=2.5)


def test_each_partition_writes_a_dq_tile_first_once_and_sums_only_what_it_wrote(rng):
    mask = mask_of("local", 4, rng)
    plan = block_plan.plan_dkv(mask, 64, 64, 2)
    for parts in (1, 2, 3):
        first, touched = mgpu_backward_fused.touch_tables(plan, parts, 2, 4)
        for p in range(plan.plan_heads):
            for r in range(parts):
                visits = [(plan.head_offset[p, j, u], plan.q_block[p, j, u], first[p, j, u])
                          for j in range(r, plan.count.shape[1], parts)
                          for u in range(plan.count[p, j])]
                seen = {(g, i) for g, i, _ in visits}
                assert sum(f for *_, f in visits) == len(seen)  # one first write per tile
                for g, i, f in visits:  # ... and it is the first visit, in walk order
                    assert f == (visits.index(next(x for x in visits if x[:2] == (g, i)))
                                 == visits.index((g, i, f)))
                assert {tuple(x) for x in np.argwhere(touched[p, r])} == seen


def test_a_configuration_over_budget_or_with_more_partitions_than_kv_blocks_is_refused(rng):
    mask = mask_of("causal", 1, rng)
    plan = block_plan.plan_dkv(mask, 64, 64, 1)
    wide = mgpu_forward.Problem(1, 1, 256, 256, 256, 256, "bfloat16", return_lse=True)
    with pytest.raises(ValueError, match="shared memory exceed the 232,448-byte limit"):
        mgpu_backward_fused.make(wide, mgpu_backward_fused.FusedBackwardConfig(TILES, 2), plan)
    small = mgpu_forward.Problem(1, 1, 256, 256, 64, 64, "bfloat16", return_lse=True)
    with pytest.raises(ValueError, match="5 partitions for 4 kv blocks"):
        mgpu_backward_fused.make(small, mgpu_backward_fused.FusedBackwardConfig(TILES, 5), plan)


@pytest.mark.timeout(240)
def test_lowered_at_the_publishable_sizes_with_its_reduction_buffer():
    params = {"heads_q": 16, "heads_kv": 16, "seq_len": 4096, "head_dim": 128,
              "mask": {"kind": "causal"}, "dtype": "bfloat16"}
    (artifact,) = builds.build("mgpu_bwd_fused", params)["artifacts"]
    facts = artifact["facts"]
    assert facts["kernel"] == "dq+dk+dv" and facts["block"][0] == 128
    assert facts["dynamic_smem_bytes"] <= facts["smem_limit_bytes"]
    parts = facts["tuning"]["dq_partitions"]
    assert parts == port.SM_COUNT // 16 and sorted(facts["grid"])[-2:] == sorted([parts, 16])
    assert facts["dq_partial_bytes"] == parts * 16 * 128 * 4096 * 4
    wide = builds.build("mgpu_bwd_fused", {**params, "head_dim": 256})
    assert wide["artifacts"] == [] and "no tile choice fits at head dim 256" in \
        wide["out_of_scope"]
    with pytest.raises(ValueError, match="exceed"):
        builds.build("mgpu_bwd_fused", {**params, "head_dim": 256,
                                      "bwd_tiles": {"block_q": 64, "block_kv": 64,
                                                    "stages": 2}})
