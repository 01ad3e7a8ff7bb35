"""Stages 5 and 6: time the verified kernel, and the baselines, at one point.

A point whose verification failed, or that could not run on this host, is never
timed: its time record says so instead. Baselines are checked against the same oracle
before they are timed, so a baseline that computes something else cannot win.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from casebook import config, paths, records, stage, verify
from casebook.errors import CasebookError
from casebook.measure import engine, guards, noise, pinning, table
from kernels import contract
from kernels.contract import Runnable


def settings_of(measurement: dict[str, Any]) -> engine.Settings:
    """The engine's settings from a ``measurement`` block (noise keys aside); a key it
    does not set takes the schema's default."""
    keys = {f.name for f in dataclasses.fields(engine.Settings)}
    block = {**config.measurement_defaults(), **measurement}
    try:
        return engine.Settings(**{k: v for k, v in block.items() if k in keys})
    except ValueError as error:
        raise CasebookError(paths.CONFIG_SCHEMA, "measurement", str(error)) from None


def default_settings(**overrides: Any) -> engine.Settings:
    """The schema's measurement defaults with ``overrides``: what a benchmark or a test
    measures with unless it says otherwise."""
    return settings_of(overrides)


def settings_for(runnable: Runnable, measurement: dict[str, Any]) -> engine.Settings:
    """The settings ``runnable`` is measured with: an interpret-mode kernel's replace some
    (``measurement.interpret``)."""
    if runnable.execution.get("interpret"):
        measurement = {**measurement, **measurement.get("interpret", {})}
    return settings_of(measurement)


def host_floor(floor_path: str) -> float:
    """The host's noise floor from its record: every interval is at least this wide."""
    return records.read(floor_path, "noise_floor")["noise_floor"]


def measure(runnable: Runnable, make_inputs, measurement: dict[str, Any], cache_mode: str,
             seed: int, samples_path: str, floor: float | None) -> dict[str, Any]:
    """The engine's measurement and its samples table, or why none could be made;
    ``floor``: the host's noise floor the interval is widened to (None: not widened)."""
    settings = settings_for(runnable, measurement)
    try:
        result = engine.measure(engine.Workload(runnable, make_inputs), settings, cache_mode,
                                seed, engine.Devices.find())
    except guards.Unmeasurable as error:
        table.write(samples_path, [])
        return {"timed": False, "not_timed_reason": f"{records.REFUSED}: {error}"}
    table.write(samples_path, result.rows)
    return {"timed": True, "measurement": {
        **result.summary(settings.confidence, floor), "samples_file": samples_path}}


def time_kernel(case_dir: str, case: str, variant: str, point: str, target: str,
                settings: dict[str, Any], verify_path: str, floor_path: str, out: str,
                samples_path: str) -> dict[str, Any]:
    job = stage.load(case_dir, case, target, point, variant)
    checked = records.read(verify_path, "verify")
    if job.tiles_from != checked.get("tile_table"):
        raise CasebookError(verify_path, "tile_table", "verified with another tile table "
                            "than the one in use now; rerun verify")
    body: dict[str, Any] = {**job.stamp(), "verify_record": verify_path}
    if not checked["passed"]:
        table.write(samples_path, [])
        why = (f"not run here: {checked['not_run_reason']}" if not checked["ran"] else
               "verification failed: " + "; ".join(checked["failures"]))
        return records.write(out, "time", {**body, "timed": False, "not_timed_reason": why})
    seed = verify.draw_seed()
    runnable = job.plugin.kernel(variant, job.tuned, "time", build_dir=job.build_dir)
    return records.write(out, "time", {
        **body, "seed": seed, "execution": runnable.execution,
        **measure(runnable, lambda rng: job.plugin.make_inputs(job.tuned, rng), settings,
                   job.spec["measurement"]["cache"], seed, samples_path,
                   host_floor(floor_path))})


def time_baseline(case_dir: str, case: str, baseline: str, point: str, target: str,
                  settings: dict[str, Any], floor_path: str, out: str,
                  samples_path: str) -> dict[str, Any]:
    job = stage.load(case_dir, case, target, point)
    spec, path, params, plugin = job.spec, job.path, job.params, job.plugin
    entry = config.find(spec["baselines"], baseline, path, "baselines")
    body = {"target": target, "case": case, "baseline": baseline, "point": point,
            "role": entry["role"], "description": entry["description"], "params": params}
    try:
        runnable = plugin.baseline(baseline, params, build_dir=job.build_dir)
    except contract.NotRunnable as reason:
        table.write(samples_path, [])
        return records.write(out, "baseline", {
            **body, "timed": False, "not_timed_reason": f"not run here: {reason}"})
    seed = verify.draw_seed()
    inputs = plugin.make_inputs(params, np.random.default_rng(seed))
    check = verify.check_outputs(
        params, inputs, runnable.fetch(runnable.call(*runnable.prepare(inputs))),
        plugin.oracle(params, inputs), verify.tolerance_of(spec, params, path),
        getattr(plugin, "compare", None))
    body.update(seed=seed, execution=runnable.execution, check=check)
    if not check["passed"]:
        table.write(samples_path, [])
        return records.write(out, "baseline", {
            **body, "timed": False,
            "not_timed_reason": "the baseline disagrees with the oracle"})
    return records.write(out, "baseline", {
        **body, **measure(runnable, lambda rng: plugin.make_inputs(params, rng), settings,
                           spec["measurement"]["cache"], seed, samples_path,
                           host_floor(floor_path))})


def a_a_floor(measurement: dict[str, Any]) -> dict[str, Any]:
    """The A/A protocol of ``measurement.noise_floor``, measured with the time stages'
    settings."""
    settings = settings_of(measurement)
    spec = measurement["noise_floor"]
    workload = noise.matmul_workload(spec["size"])
    devices = engine.Devices.find()

    def one(seed: int) -> engine.Measurement:
        return engine.measure(workload, settings, spec["cache"], seed, devices)

    return noise.a_a(one, spec["rounds"], spec["quantile"])


def noise_floor(target: str, measurement: dict[str, Any], out: str) -> dict[str, Any]:
    """Stage: this host's A/A noise floor record."""
    settings = settings_of(measurement)
    spec = measurement["noise_floor"]
    result = a_a_floor(measurement)
    return records.write(out, "noise_floor", {
        "target": target, "workload": f"jitted float32 matmul {spec['size']}×{spec['size']} "
                                      f"(jax.numpy.matmul)",
        "stop_criterion": settings.criterion, "stop_target": settings.target,
        "repeats": settings.repeats, "pinned_cpu": pinning.pinned_cpu(), **result})
