"""The verify stage: the kernel against the float64 oracle on fresh seeded inputs.

The oracle may answer several named outputs; a kernel returns some of them and each is
checked against its own tolerance. A kernel that cannot execute on this host
(``contract.NotRunnable``) gets a record that says so: not run, which is not a failure.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from casebook.core import cases, config, paths, records
from casebook.stages import point_job
from kernels import contract

ORACLE = "float64 numpy evaluation of the same problem on the same (rounded) inputs"
SEED_VARIABLE = "CASEBOOK_SEED"  # set to replay a recorded draw
SINGLE_OUTPUT = contract.SINGLE_OUTPUT  # the name of an output given as a bare array

Tolerance = Callable[[str], dict[str, Any]]  # output name -> {atol, rtol, reason}


def draw_seed() -> int:
    """A fresh seed per run (recorded), or the one in $CASEBOOK_SEED to replay."""
    fixed = os.environ.get(SEED_VARIABLE)
    return int(fixed) if fixed else secrets.randbits(63)


def named(outputs: Any) -> dict[str, np.ndarray]:
    """Outputs as ``{name: array}``: a bare array is the single output ``out``."""
    if isinstance(outputs, dict):
        return {name: value if isinstance(value, contract.SampledRows) else np.asarray(value)
                for name, value in outputs.items()}
    return {SINGLE_OUTPUT: np.asarray(outputs)}


def compare(out: np.ndarray, want: np.ndarray | contract.SampledRows, atol: float,
            rtol: float) -> dict[str, Any]:
    """Elementwise |out - want| <= atol + rtol |want| (atol = rtol = 0: bit-exact); NaN or
    a shape change never pass. Against sampled rows: those rows so, and no NaN anywhere."""
    if isinstance(want, contract.SampledRows):
        return _compare_rows(out, want, atol, rtol)
    if out.shape != want.shape:
        return {"passed": False, "error": f"shape {out.shape} != oracle {want.shape}",
                "nan_count": 0, "max_abs_error": None, "max_rel_error": None,
                "worst_error_over_tolerance": None}
    out, want = out.astype(np.float64), want.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.abs(out - want)  # NaN where either side is NaN or both are inf
        ratio = np.where(err == 0, 0.0, err / (atol + rtol * np.abs(want)))
    ratio = np.where(np.isnan(ratio), np.inf, ratio)  # NaN never passes
    nan_count = int(np.count_nonzero(~np.isfinite(out)))
    finite = np.where(np.isfinite(err), err, 0.0)
    scale = np.maximum(np.abs(want), atol or np.finfo(np.float64).tiny)
    worst = float(np.max(ratio, initial=0.0))
    return {
        "passed": nan_count == 0 and worst <= 1,
        "nan_count": nan_count,
        "max_abs_error": float(np.max(finite, initial=0.0)),
        "max_rel_error": float(np.max(finite / scale, initial=0.0)),
        "worst_error_over_tolerance": worst if nan_count == 0 and np.isfinite(worst) else None,
    }


def _compare_rows(out: np.ndarray, want: contract.SampledRows, atol: float,
                  rtol: float) -> dict[str, Any]:
    if out.shape != want.shape:
        found = {"passed": False, "error": f"shape {out.shape} != oracle {want.shape}",
                 "nan_count": 0, "max_abs_error": None, "max_rel_error": None,
                 "worst_error_over_tolerance": None}
    else:
        found = compare(out[want.index], want.values(), atol, rtol)
        unwritten = int(np.count_nonzero(~np.isfinite(out.astype(np.float64))))
        found = {**found, "nan_count": unwritten,
                 "passed": found["passed"] and unwritten == 0}
    return {**found, "sampled": {"rows": want.rows, "of": want.total, "seed": want.seed}}


def check_outputs(params: dict[str, Any], inputs: dict[str, np.ndarray], got: Any,
                  want: Any, tolerance: Tolerance,
                  own_compare: Callable[..., dict[str, Any] | None] | None = None,
                  poisoned: bool = False, beside: Any = None) -> dict[str, Any]:
    """Every output the kernel returned against the oracle's output of that name, and the
    worst of them; an output the oracle lacks, or none at all, fails. ``poisoned``: the
    outputs were NaN before the kernel ran, so a case's compare may demand that what a
    kernel must not write is still NaN. A case's compare also sees every output the kernel
    wrote (its intermediates, for a check that follows the path): ``got``'s, and where
    only some are checked, ``beside`` holds the rest."""
    got, want = named(got), named(want)
    every = {**(named(beside) if beside is not None else {}), **got}
    outputs: dict[str, dict[str, Any]] = {}
    for name, value in got.items():
        if name not in want:
            outputs[name] = {"passed": False, "error": f"the oracle has no output {name!r} "
                             f"(it has {sorted(want)})", "nan_count": 0,
                             "max_abs_error": None, "worst_error_over_tolerance": None}
            continue
        tol = tolerance(name)
        check = (own_compare(params, inputs, name, value, want[name], tol, poisoned, every)
                 if own_compare else None)
        outputs[name] = check if check is not None else compare(
            value, want[name], tol["atol"], tol["rtol"])
    if not outputs:
        return {"passed": False, "error": "the kernel returned no outputs", "outputs": {}}
    errors = [f"{name}: {c['error']}" for name, c in outputs.items() if c.get("error")]
    worst = [c["worst_error_over_tolerance"] for c in outputs.values()]
    found = {
        "passed": all(c["passed"] for c in outputs.values()),
        "nan_count": sum(c.get("nan_count") or 0 for c in outputs.values()),
        "max_abs_error": max((c["max_abs_error"] for c in outputs.values()
                              if c.get("max_abs_error") is not None), default=None),
        "worst_error_over_tolerance": None if None in worst else max(worst),
        "outputs": outputs,
    }
    return {**found, "error": "; ".join(errors)} if errors else found


def _why(check: dict[str, Any]) -> str:
    """What is wrong with a failed ``check_outputs``, in words."""
    if check.get("error"):
        why = check["error"]
    elif check["nan_count"]:
        why = f"{check['nan_count']} non-finite outputs"
    else:
        bad = [name for name, c in check.get("outputs", {}).items() if not c["passed"]]
        worst = check["worst_error_over_tolerance"]
        why = ((f"error {worst:.3g}× the tolerance" if worst is not None
                else "not equal where the tolerance is exact")
               + (f" ({', '.join(bad)})" if bad else ""))
    return why


def _failure(check: dict[str, Any]) -> str:
    return f"{check['purpose']} trial {check['trial']}: {_why(check)}"


def check_trial(runnable, plugin, params, inputs, tolerance) -> dict[str, Any]:
    """One run of ``runnable`` on ``inputs`` checked against ``plugin``'s oracle, which
    runs only once the output is fetched, on a copy of the inputs made before the run:
    no expected output exists in memory while the kernel runs, for it to find and copy
    (github.com/gpu-mode/pygpubench/pull/7), and a kernel that changes its inputs so
    that the oracle agrees with it (zeroes them and returns zeros:
    github.com/ScalingIntelligence/KernelBench/pull/82) fails."""
    pristine = {name: np.array(value, copy=True) for name, value in inputs.items()}
    began = time.perf_counter()
    try:
        got = runnable.fetch(runnable.call(*runnable.prepare(inputs)))
    except Exception as error:  # a kernel that raises fails verification, visibly
        return {"passed": False, "error": f"{type(error).__name__}: {error}"}
    ran = time.perf_counter()
    changed = [name for name, value in pristine.items()
               if not np.array_equal(value, inputs[name], equal_nan=True)]
    found = check_outputs(params, pristine, got, plugin.oracle(params, pristine), tolerance,
                          getattr(plugin, "compare", None), runnable.execution["poisoned"])
    progress(f"kernel {ran - began:.1f} s (its compile included on a first call), "
             f"oracle and check {time.perf_counter() - ran:.1f} s")
    if changed:
        why = f"the kernel changed its input(s) {', '.join(changed)}"
        return {**found, "passed": False,
                "error": "; ".join(filter(None, [found.get("error"), why]))}
    return found


def oracle_check(plugin: Any, params: dict[str, Any], spec: dict[str, Any], path: object,
                 runnable: Any) -> Callable[[dict[str, np.ndarray], Any], str | None]:
    """What the measuring engine holds a timed call's fetched output to
    (``engine.Workload.check``): why it is wrong for its inputs, by the oracle and
    tolerance verification uses, or None."""
    tolerance = tolerance_of(spec, params, path)

    def check(inputs: dict[str, np.ndarray], got: Any) -> str | None:
        found = check_outputs(params, inputs, got, plugin.oracle(params, inputs), tolerance,
                              getattr(plugin, "compare", None),
                              runnable.execution["poisoned"])
        return None if found["passed"] else _why(found)
    return check


def progress(line: str) -> None:
    """One line of where a verification is, to the job's log as it goes: a job stopped
    midway (a device window's budget) still shows where its time went."""
    sys.stderr.write(f"verify: {line}\n")
    sys.stderr.flush()


def host_matmul_rate(n: int = 1024) -> str:
    """numpy's float64 matmul rate here, in words: the host oracle's speed, which its
    BLAS threads set (a process whose BLAS was sized for one thread runs it ~10x slower
    on a 13-core host)."""
    a = np.ones((n, n))
    began = time.perf_counter()
    a @ a
    rate = 2 * n**3 / max(time.perf_counter() - began, 1e-9) / 1e9
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"numpy float64 matmul at {rate:.0f} GFLOP/s on {cpus} CPU(s) allowed"


def tolerance_of(spec: dict[str, Any], params: dict[str, Any], path: object) -> Tolerance:
    """The case's tolerance lookup for the dtype of ``params``."""
    return lambda output: config.tolerance(spec, params["dtype"], output, path)


def run(case_dir: str, case: str, variant: str, point: str, target: str,
        out: str) -> dict[str, Any]:
    job = point_job.load(case_dir, case, target, point, variant)
    return records.write(out, "verify", {
        **job.stamp(), **check_point(job.plugin, variant, job.tuned, job.spec, job.path)})


def check_point(plugin: Any, variant: str, params: dict[str, Any], spec: dict[str, Any],
                path: object) -> dict[str, Any]:
    """What verification found for ``variant`` at ``params``: the body of a verify record."""
    tolerance = tolerance_of(spec, params, path)
    seed = draw_seed()
    streams = np.random.SeedSequence(seed).spawn(spec["verify"]["trials"])
    checks: list[dict[str, Any]] = []
    not_run = None
    why_not = cases.refusal(plugin, params)
    if why_not:
        checks.append({"purpose": "check", "trial": 0, "passed": False, "error": why_not})
    else:
        contract.reset(plugin)
        build_dir = paths.build_dir(spec["name"])
        began = time.perf_counter()
        try:
            runnables = {p: plugin.kernel(variant, params, p, build_dir=build_dir)
                         for p in ("check", "time")}
        except contract.NotRunnable as reason:
            runnables, not_run = {}, str(reason)
        progress(f"{variant}: kernels made in {time.perf_counter() - began:.1f} s; "
                 f"{host_matmul_rate()}")
        for purpose, runnable in runnables.items():
            for trial, stream in enumerate(streams):
                began = time.perf_counter()
                inputs = plugin.make_inputs(params, np.random.default_rng(stream))
                progress(f"{purpose} trial {trial}: inputs drawn in "
                         f"{time.perf_counter() - began:.1f} s")
                checks.append({"purpose": purpose, "trial": trial,
                               "execution": runnable.execution,
                               **check_trial(runnable, plugin, params, inputs, tolerance)})
    races = contract.races_found(plugin)
    failures = [_failure(c) for c in checks if not c["passed"]]
    if races:
        failures.append("the interpreter's race detector reported a race")
    worst = [c["worst_error_over_tolerance"] for c in checks
             if c.get("worst_error_over_tolerance") is not None]
    return {
        "oracle": ORACLE,
        "tolerance": spec["tolerances"][params["dtype"]],
        "seed": seed,
        "trials": len(streams),
        "ran": not_run is None,
        **({"not_run_reason": not_run} if not_run else {}),
        "checks": checks,
        "races_found": races,
        "max_abs_error": max((c.get("max_abs_error") or 0.0 for c in checks), default=0.0),
        "worst_error_over_tolerance": max(worst) if checks and len(worst) == len(checks)
        else None,
        "passed": not_run is None and not failures,
        "failures": failures,
    }
