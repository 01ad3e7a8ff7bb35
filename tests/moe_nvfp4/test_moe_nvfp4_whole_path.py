"""Case 01's whole-path check (kernels/moe_nvfp4/whole_path.py): out_fused through the
kernel's own a2, out_unfused through its own h with the requantize's ties resolved. Each
term is shown to matter: the check fails when the kernel's intermediate is ignored, a
bias of a thousandth of the RMS, a skipped requantize, a missing intermediate; it passes
a code the kernel took the other way at a tie only where that code is the kernel's."""

from __future__ import annotations

import numpy as np
import pytest

from casebook.core import cases, config, paths
from kernels.moe_nvfp4 import checks, numerics, whole_path

moe = cases.load("moe_nvfp4")
SPEC = config.load_case(paths.SOURCE_ROOT / "configs/cases", "moe_nvfp4")
POINTS = [p["params"] for p in SPEC["points"]]


def tolerance(output):
    return config.tolerance(SPEC, "nvfp4", output, "moe_nvfp4.yaml")


def drawn(rng, params):
    inputs = moe.make_inputs(params, rng)
    want = moe.oracle(params, inputs)
    return inputs, want, moe.model_outputs(params, inputs, want)


def judged(inputs, want, output, value, **given):
    return moe.compare(POINTS[0], inputs, output, value, want[output], tolerance(output),
                       outputs=given)


def rms(x):
    return float(np.sqrt(np.nanmean(np.square(x))))


@pytest.mark.parametrize("params", POINTS, ids=[p["name"] for p in SPEC["points"]])
def test_a_correct_whole_path_passes_and_a_thousandth_of_its_rms_fails(rng, params):
    inputs, want, correct = drawn(rng, params)
    for output, given in (("out_fused", {"a2": correct["a2"]}),
                          ("out_unfused", {"h": correct["h"]})):
        found = judged(inputs, want, output, correct[output], **given)
        assert found["passed"] and 0.3 < found["worst_error_over_tolerance"] <= 1, found
        biased = correct[output] + 1e-3 * rms(correct[output])
        assert not judged(inputs, want, output, biased, **given)["passed"]


def test_out_fused_follows_the_kernels_own_a2_not_the_models(rng):
    """A kernel that took the other rounding of one a2 code writes GEMM2 of that a2: it
    passes against its own a2, and the model's out fails against it."""
    inputs, want, correct = drawn(rng, POINTS[0])
    a2 = correct["a2"].copy()
    e, m = int(np.argmax(inputs["masked_m"])), 0  # a row the kernel computes
    n = int(np.argmax(np.abs(a2[0, e, m])))  # a nonzero code, stepped toward zero
    grid = np.unique(np.abs(numerics.E2M1_VALUES))
    step = grid[np.searchsorted(grid, abs(a2[0, e, m, n])) - 1]
    a2[0, e, m, n] = np.copysign(step, a2[0, e, m, n])
    own = numerics.bf16(np.where(np.isnan(want["out"][0]), np.nan, np.einsum(
        "emn,ekn->emk", np.nan_to_num(a2[0] * a2[1]) * inputs["alpha2"][:, None, None],
        numerics.dequantize(inputs["w2_packed"], inputs["w2_scales"]))))
    assert judged(inputs, want, "out_fused", own, a2=a2)["passed"]
    assert not judged(inputs, want, "out_fused", correct["out_fused"], a2=a2)["passed"]


def test_a_skipped_requantize_and_a_missing_intermediate_fail(rng):
    inputs, want, correct = drawn(rng, POINTS[0])
    for mutant in moe.mutants(POINTS[0]):
        if mutant.name != "act_not_requantized":
            continue
        got = mutant.make(POINTS[0], inputs, want, correct[mutant.output])
        given = {"a2": correct["a2"]} if mutant.output == "out_fused" else {"h": correct["h"]}
        assert not judged(inputs, want, mutant.output, got, **given)["passed"]
    missing = judged(inputs, want, "out_fused", correct["out_fused"])
    assert not missing["passed"] and "checked through the same kernel's a2" in missing["error"]
    assert checks.THROUGH == {"out_fused": "a2", "out_unfused": "h"}


def test_resolve_finds_the_ties_a_row_took_and_no_more(rng):
    """Units taken by the kernel are found; a residual no subset of units explains (a
    constant bias, one unit at half its step) is not passed."""
    units, k = 12, 256
    effects = rng.standard_normal((units, k))
    taken = (rng.random(units) < 0.5).astype(np.float64)
    noise = 1e-6 * rng.standard_normal(k)

    def allowed(delta):
        return np.full(k, 1e-5)

    delta, worst = whole_path.resolve(taken @ effects + noise, effects, allowed)
    assert np.array_equal(delta, taken) and worst <= 1
    assert whole_path.resolve(taken @ effects + 1e-3, effects, allowed)[1] > 1
    assert whole_path.resolve(taken @ effects + 0.5 * effects[0], effects, allowed)[1] > 1


def test_an_unfused_tie_is_a_unit_only_where_act_may_round_either_way(rng):
    """Away from a tie (further than the requantize's own 2^-21 window) an element is no
    unit; once act's slack reaches the tie, it is one: its other rounding through w2."""
    act = rng.choice([-3.0, -2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0, 3.0], (1, 1, 32))
    act[0, 0, [1, 17]] = 6.0  # each block's amax: with gs 1 both scales are exactly 1
    act[0, 0, 0] = 0.75 + 1e-5  # 1e-5 above the tie of e2m1 0.5 and 1: rounds to 1
    gs, w2 = np.array([1.0]), rng.standard_normal((1, 8, 32))
    valid = np.ones((1, 1), bool)
    assert np.array_equal(numerics.round_e4m3(numerics.block_scale(act, gs)), [[[1.0, 1.0]]])
    slack = np.zeros_like(act)
    assert whole_path.units(act, slack, gs, w2, np.ones(1), valid)[1] == 0
    slack[0, 0, 0] = 1e-4  # now reaching the tie
    effects, count = whole_path.units(act, slack, gs, w2, np.ones(1), valid)
    assert count == 1 and np.allclose(effects[0, 0][0], -0.5 * w2[0, :, 0])
