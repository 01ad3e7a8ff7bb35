"""Stage 4, verify: the kernel against the float64 oracle on fresh seeded inputs."""

from __future__ import annotations

import os
import secrets
from typing import Any

import numpy as np

from casebook import cases, config, provenance, records

ORACLE = "float64 numpy evaluation of the same problem on the same (rounded) inputs"
SEED_VARIABLE = "CASEBOOK_SEED"  # set to replay a recorded draw


def draw_seed() -> int:
    """A fresh seed per run (recorded), or the one in $CASEBOOK_SEED to replay."""
    fixed = os.environ.get(SEED_VARIABLE)
    return int(fixed) if fixed else secrets.randbits(63)


def compare(out: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> dict[str, Any]:
    """Elementwise |out - want| <= atol + rtol |want|; NaN or a shape change never pass."""
    if out.shape != want.shape:
        return {"passed": False, "error": f"shape {out.shape} != oracle {want.shape}",
                "nan_count": 0, "max_abs_error": None, "max_rel_error": None,
                "worst_error_over_tolerance": None}
    out = out.astype(np.float64)
    err = np.abs(out - want)
    bound = atol + rtol * np.abs(want)
    nan_count = int(np.count_nonzero(~np.isfinite(out)))
    ratio = np.where(np.isfinite(err), err / bound, np.inf)
    return {
        "passed": nan_count == 0 and bool(np.all(ratio <= 1)),
        "nan_count": nan_count,
        "max_abs_error": float(np.max(np.where(np.isfinite(err), err, 0.0))),
        "max_rel_error": float(np.max(np.where(np.isfinite(err), err, 0.0)
                                      / np.maximum(np.abs(want), atol))),
        "worst_error_over_tolerance": float(np.max(ratio)) if nan_count == 0 else None,
    }


def _failure(check: dict[str, Any]) -> str:
    if check.get("error"):
        why = check["error"]
    elif check["nan_count"]:
        why = f"{check['nan_count']} non-finite outputs"
    else:
        why = f"error {check['worst_error_over_tolerance']:.3g}× the tolerance"
    return f"{check['purpose']} trial {check['trial']}: {why}"


def _trial(runnable, inputs, want, tol) -> dict[str, Any]:
    try:
        out = runnable.fetch(runnable.call(*runnable.prepare(inputs)))
    except Exception as error:  # a kernel that raises fails verification, visibly
        return {"passed": False, "error": f"{type(error).__name__}: {error}"}
    return compare(out, want, tol["atol"], tol["rtol"])


def run(case_dir: str, case: str, variant: str, point: str, target: str,
        out: str) -> dict[str, Any]:
    spec = config.load_case(case_dir, case)
    path = config.case_path(case_dir, case)
    config.find(spec["variants"], variant, path, "variants")
    params = config.find(spec["points"], point, path, "points")["params"]
    tol = spec["tolerances"][params["dtype"]]
    plugin = cases.load(case)
    seed = draw_seed()
    streams = np.random.SeedSequence(seed).spawn(spec["verify"]["trials"])
    checks = []
    why_not = plugin.check_params(params)
    if why_not:
        checks.append({"purpose": "check", "trial": 0, "passed": False, "error": why_not})
    else:
        plugin.reset()
        for purpose in ("check", "time"):
            runnable = plugin.kernel(variant, params, purpose)
            for trial, stream in enumerate(streams):
                inputs = plugin.make_inputs(params, np.random.default_rng(stream))
                want = plugin.oracle(params, inputs)
                checks.append({"purpose": purpose, "trial": trial,
                               "execution": runnable.execution,
                               **_trial(runnable, inputs, want, tol)})
    races = plugin.races_found()
    failures = [_failure(c) for c in checks if not c["passed"]]
    if races:
        failures.append("the interpreter's race detector reported a race")
    worst = [c["worst_error_over_tolerance"] for c in checks
             if c.get("worst_error_over_tolerance") is not None]
    return records.write(out, "verify", {
        "target": target, "case": case, "variant": variant, "point": point,
        "params": params,
        "sources_sha256": provenance.case_sources_sha256(case, path),
        "oracle": ORACLE,
        "tolerance": tol,
        "seed": seed,
        "trials": len(streams),
        "checks": checks,
        "races_found": races,
        "max_abs_error": max((c.get("max_abs_error") or 0.0 for c in checks), default=0.0),
        "worst_error_over_tolerance": max(worst) if len(worst) == len(checks) else None,
        "passed": not failures,
        "failures": failures,
    })
