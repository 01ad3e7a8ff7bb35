"""Each case declares, without running anything, the outputs every variant and baseline
returns (``outputs``, ``baseline_outputs``), so the case config can be checked for their
tolerances when it loads. Here the declaration meets what the runnables really return on
a small point: a JAX runnable is traced (``jax.eval_shape``, nothing executes), any other
one (the numpy model) is run; a GPU-only one on a host without that GPU is checked
against the oracle's names only.
"""

from __future__ import annotations

import numpy as np
import pytest

from casebook.core import cases, config, paths
from casebook.stages import verify
from kernels import contract

pytestmark = [pytest.mark.interpret, pytest.mark.timeout(600), pytest.mark.host_rehearsal]
CASES = ("splash_attention", "moe_nvfp4", "grouped_gemm_fp8_bf16")
SPECS = {case: config.load_case("configs/cases", case) for case in CASES}
ROWS = [(case, group, item["name"]) for case in CASES for group in ("variants", "baselines")
        for item in SPECS[case][group]]


def points_by_size(case: str) -> list[tuple[dict, dict]]:
    """The case's points, smallest inputs first, each with inputs drawn for it."""
    plugin = cases.load(case)
    drawn = [(p["params"], plugin.make_inputs(p["params"], np.random.default_rng(0)))
             for p in SPECS[case]["points"]]
    return sorted(drawn, key=lambda d: sum(x.nbytes for x in d[1].values()))


def declared(case: str, group: str, name: str) -> tuple[str, ...]:
    plugin = cases.load(case)
    return (plugin.outputs if group == "variants" else plugin.baseline_outputs)(name)


def runnable(case: str, group: str, name: str, params: dict):
    plugin = cases.load(case)
    if group == "variants":
        return plugin.kernel(name, params, "check", build_dir=paths.build_dir(case))
    return plugin.baseline(name, params, build_dir=paths.build_dir(case))


def returned(run, inputs: dict) -> tuple[str, ...]:
    """The names ``run`` returns: traced where it is a JAX function, else run."""
    if run.execution.get("framework", "").startswith("jax"):
        import jax

        shape = jax.eval_shape(run.call, *run.prepare(inputs))
        return tuple(shape) if isinstance(shape, dict) else (contract.SINGLE_OUTPUT,)
    return tuple(verify.named(run.fetch(run.call(*run.prepare(inputs)))))


@pytest.mark.parametrize(("case", "group", "name"), ROWS, ids=[f"{c}-{n}" for c, _, n in ROWS])
def test_declared_outputs_are_what_the_runnable_returns(case, group, name):
    outputs = declared(case, group, name)
    assert outputs and len(set(outputs)) == len(outputs)
    reasons = []
    for params, inputs in points_by_size(case):  # the smallest point it runs at
        want = verify.named(cases.load(case).oracle(params, inputs))
        assert set(outputs) <= set(want), f"the oracle has no {set(outputs) - set(want)}"
        try:
            run = runnable(case, group, name, params)
        except contract.NotRunnable as reason:
            reasons.append(str(reason))
            continue
        assert sorted(returned(run, inputs)) == sorted(outputs)
        return
    pytest.skip(f"declared {outputs}, which the oracle answers; not runnable here at any "
                f"point: {'; '.join(sorted(set(reasons)))}")


@pytest.mark.parametrize("case", CASES)
def test_an_unknown_name_is_refused(case):
    plugin = cases.load(case)
    with pytest.raises(ValueError, match="nosuch"):
        plugin.outputs("nosuch")
    with pytest.raises(ValueError, match="nosuch"):
        plugin.baseline_outputs("nosuch")


def test_every_case_exposes_the_declarations():
    assert {"outputs", "baseline_outputs"} <= set(contract.REQUIRED)
    for case in CASES:
        cases.load(case)  # raises naming the first function of the surface missing
