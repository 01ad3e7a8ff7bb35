"""Verification of named outputs, per-output and exact tolerances, a case's own
comparison, and a kernel that cannot run on this host."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from casebook.core import config, records
from casebook.core.errors import CasebookError
from casebook.stages import verify
from kernels import contract
from kernels.contract import Runnable

LOOSE = {"atol": 1e-3, "rtol": 1e-3, "reason": "loose enough for the test"}
EXACT = {"atol": 0, "rtol": 0, "reason": "the model says it is exact"}
SPEC = {"name": "fake_case", "tolerances": {"float32": {"y": LOOSE, "codes": EXACT}},
        "verify": {"trials": 2}}
PARAMS = {"dtype": "float32", "n": 8}


def plugin(kernel_outputs, **extra) -> SimpleNamespace:
    """A case whose oracle answers y = 2x and codes = floor(x); the kernel is given."""
    def kernel(variant, params, purpose, build_dir=None):
        return Runnable(prepare=lambda inputs: (inputs["x"],), call=kernel_outputs,
                        sync=lambda out: None, fetch=lambda out: out,
                        execution=contract.execution("numpy"))

    return SimpleNamespace(
        make_inputs=lambda params, rng: {"x": rng.standard_normal(params["n"]) * 4},
        oracle=lambda params, inputs: {"y": 2 * inputs["x"], "codes": np.floor(inputs["x"])},
        check_params=lambda params: None, kernel=kernel, races_found=lambda: False,
        reset=lambda: None, **extra)


def check(case, spec=SPEC) -> dict:
    return verify.check_point(case, "v", PARAMS, spec, "case.yaml")


def test_each_output_is_checked_against_its_own_tolerance():
    found = check(plugin(lambda x: {"y": 2 * x + 1e-4, "codes": np.floor(x)}))
    assert found["passed"] and found["ran"] and len(found["checks"]) == 4
    outputs = found["checks"][0]["outputs"]
    assert set(outputs) == {"y", "codes"} and outputs["codes"]["max_abs_error"] == 0


def test_an_exact_tolerance_rejects_the_smallest_difference():
    found = check(plugin(lambda x: {"codes": np.nextafter(np.floor(x), np.inf)}))
    assert not found["passed"]
    assert "not equal where the tolerance is exact (codes)" in found["failures"][0]


def test_a_stage_kernel_returns_some_outputs_but_never_an_unknown_one():
    assert check(plugin(lambda x: {"y": 2 * x}))["passed"]
    found = check(plugin(lambda x: {"y": 2 * x, "z": x}))
    assert not found["passed"] and "the oracle has no output 'z'" in found["failures"][0]
    assert not check(plugin(lambda x: {}))["passed"]


def test_nan_never_passes_even_where_the_oracle_is_nan():
    with_nan = lambda x: {"y": np.full_like(x, np.nan)}  # noqa: E731
    assert not check(plugin(with_nan))["passed"]
    both = verify.compare(np.array([np.nan]), np.array([np.nan]), 1.0, 1.0)
    assert not both["passed"] and both["nan_count"] == 1


def test_an_output_without_a_tolerance_names_the_key():
    spec = {**SPEC, "tolerances": {"float32": {"codes": EXACT}}}
    with pytest.raises(CasebookError, match=r"tolerances\.float32\.y"):
        check(plugin(lambda x: {"y": 2 * x}), spec)


def test_a_case_may_compare_an_output_its_own_way():
    """A case's compare sees each output, and beside it every output the kernel wrote."""
    seen = []

    def compare(params, inputs, output, got, want, tolerance, poisoned, outputs):
        seen.append(output)
        assert set(outputs) == {"y", "codes"} and outputs[output] is got
        if output != "codes":
            return None
        ties = np.abs(got - want) <= 1  # e.g. a quantizer allowed either code at a tie
        return {"passed": bool(ties.all()), "nan_count": 0, "max_abs_error": 1.0,
                "max_rel_error": 1.0, "worst_error_over_tolerance": 1.0}

    found = check(plugin(lambda x: {"y": 2 * x, "codes": np.floor(x) + 1}, compare=compare))
    assert found["passed"] and {"y", "codes"} == set(seen)


def test_a_kernel_that_cannot_run_here_is_recorded_as_not_run(tmp_path):
    def kernel(variant, params, purpose, build_dir=None):
        raise contract.NotRunnable("needs an sm_90a GPU; this host has none")

    found = check(SimpleNamespace(**{**vars(plugin(None)), "kernel": kernel}))
    assert found["ran"] is False and found["passed"] is False and found["checks"] == []
    assert found["not_run_reason"] == "needs an sm_90a GPU; this host has none"
    body = {"target": "cpu", "case": "c", "variant": "v", "point": "p", "params": PARAMS,
            "sources_sha256": "0" * 64, **found}
    records.write(tmp_path / "v.json", "verify", body)  # the schema accepts it
    with pytest.raises(CasebookError):  # ... but not a "not run" that claims checks
        records.write(tmp_path / "w.json", "verify",
                      {**body, "checks": [{"purpose": "check", "trial": 0, "passed": True}]})


def test_tolerance_rows_list_every_output():
    rows = config.tolerance_rows({"tolerances": {"float32": {"y": LOOSE, "codes": EXACT},
                                                 "bfloat16": LOOSE}})
    assert [(d, o) for d, o, _ in rows] == [("float32", "y"), ("float32", "codes"),
                                            ("bfloat16", None)]


def test_a_kernel_that_changes_its_inputs_fails_and_the_oracle_sees_them_unchanged():
    """It zeroes its input and answers zeros: an oracle run on the input as it is after
    the kernel would agree (KernelBench's exploit); the oracle runs on a copy made
    before, and the change itself fails."""
    def zeroing(x):
        x[...] = 0
        return {"y": np.zeros_like(x)}

    found = check(plugin(zeroing))
    assert not found["passed"]
    assert "the kernel changed its input(s) x" in found["failures"][0]
    assert found["checks"][0]["worst_error_over_tolerance"] > 1


def test_the_oracle_runs_only_after_the_kernels_output_is_fetched():
    """No expected output exists while the kernel runs, for it to find and copy."""
    events = []
    case = plugin(lambda x: events.append("kernel") or {"y": 2 * x})
    oracle = case.oracle
    case.oracle = lambda params, inputs: events.append("oracle") or oracle(params, inputs)
    assert check(case)["passed"]
    assert events == ["kernel", "oracle"] * 4


def test_each_trial_says_where_its_time_went_as_it_goes(capsys):
    """A job a device window's budget stops midway still shows, in its log, how long the
    kernels took to make and each trial's inputs, kernel and oracle took."""
    check(plugin(lambda x: {"y": 2 * x}))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("verify: v: kernels made in ")
    assert re.search(r"; numpy float64 matmul at \d+ GFLOP/s on \d+ CPU\(s\) allowed$",
                     lines[0])
    trials = [line for line in lines if line.startswith(("verify: check trial",
                                                         "verify: time trial"))]
    kernels = [line for line in lines if line.startswith("verify: kernel ")]
    assert len(trials) == len(kernels) == 4 and all("oracle and check" in k for k in kernels)
