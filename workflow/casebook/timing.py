"""Stages 5 and 6: time the verified kernel, and the baselines, at one point.

A point whose verification failed is never timed: its time record says so instead.
Baselines are checked against the same oracle before they are timed, so a baseline
that computes something else cannot win.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from casebook import cases, config, measure, provenance, records, verify
from kernels.runnable import Runnable


def protocol(settings: dict[str, Any]) -> measure.Protocol:
    return measure.Protocol(**settings)


def _write_samples(path: str, samples: list[float]) -> None:
    table = io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(["sample", "seconds"])
    writer.writerows(enumerate(samples))
    records.atomic_write_text(path, table.getvalue())


def _measure(runnable: Runnable, inputs: dict[str, np.ndarray], settings: dict[str, Any],
             samples_path: str) -> dict[str, Any]:
    args = runnable.prepare(inputs)
    samples, reason = measure.sample(lambda: runnable.sync(runnable.call(*args)),
                                     protocol(settings))
    _write_samples(samples_path, samples)
    return {
        "clock": measure.CLOCK,
        "warmup_calls": settings["warmup_calls"],
        "stop_reason": reason,
        "samples_file": samples_path,
        **measure.summarize(samples, settings["confidence"]),
    }


def _context(case_dir: str, case: str, point: str):
    spec = config.load_case(case_dir, case)
    path = config.case_path(case_dir, case)
    params = config.find(spec["points"], point, path, "points")["params"]
    return spec, path, params, cases.load(case)


def time_kernel(case_dir: str, case: str, variant: str, point: str, target: str,
                settings: dict[str, Any], verify_path: str, out: str,
                samples_path: str) -> dict[str, Any]:
    _spec, path, params, plugin = _context(case_dir, case, point)
    checked = records.read(verify_path, "verify")
    body: dict[str, Any] = {
        "target": target, "case": case, "variant": variant, "point": point,
        "params": params, "verify_record": verify_path,
        "sources_sha256": provenance.files_sha256([*provenance.kernel_sources(case), path]),
    }
    if not checked["passed"]:
        records.atomic_write_text(samples_path, "sample,seconds\n")
        return records.write(out, "time", {
            **body, "timed": False,
            "not_timed_reason": "verification failed: " + "; ".join(checked["failures"])})
    seed = verify.draw_seed()
    runnable = plugin.kernel(variant, params, "time")
    inputs = plugin.make_inputs(params, np.random.default_rng(seed))
    return records.write(out, "time", {
        **body, "timed": True, "seed": seed, "execution": runnable.execution,
        "measurement": _measure(runnable, inputs, settings, samples_path)})


def time_baseline(case_dir: str, case: str, baseline: str, point: str, target: str,
                  settings: dict[str, Any], out: str, samples_path: str) -> dict[str, Any]:
    spec, path, params, plugin = _context(case_dir, case, point)
    entry = config.find(spec["baselines"], baseline, path, "baselines")
    tol = spec["tolerances"][params["dtype"]]
    seed = verify.draw_seed()
    runnable = plugin.baseline(baseline, params)
    inputs = plugin.make_inputs(params, np.random.default_rng(seed))
    check = verify.compare(runnable.fetch(runnable.call(*runnable.prepare(inputs))),
                           plugin.oracle(params, inputs), tol["atol"], tol["rtol"])
    body = {"target": target, "case": case, "baseline": baseline, "point": point,
            "role": entry["role"], "description": entry["description"], "params": params,
            "seed": seed, "execution": runnable.execution, "check": check}
    if not check["passed"]:
        records.atomic_write_text(samples_path, "sample,seconds\n")
        return records.write(out, "baseline", {
            **body, "timed": False,
            "not_timed_reason": "the baseline disagrees with the oracle"})
    return records.write(out, "baseline", {
        **body, "timed": True, "measurement": _measure(runnable, inputs, settings, samples_path)})
