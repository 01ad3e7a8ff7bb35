"""The noise_floor, time, baseline and compare stages: the host's noise floor; the
verified kernel, and the baselines, timed at one point; then compared, measured
interleaved.

A point whose verification failed, or that could not run on this host, is never
timed: its time record says so instead. Baselines are checked against the same oracle
before they are timed, so a baseline that computes something else cannot win.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from casebook.core import config, paths, records, speed_of_light, stand_ins
from casebook.core.errors import CasebookError
from casebook.measure import engine, guards, noise, peaks, pinning, samples_file, stats
from casebook.report import evidence, history
from casebook.stages import point_job, verify
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
    """The settings ``runnable`` is measured with: a host stand-in's (``stand_ins.is_stand_in``:
    an interpret-mode kernel, a numerics model) replace some (``measurement.interpret``)."""
    if stand_ins.is_stand_in(runnable.execution):
        measurement = {**measurement, **measurement.get("interpret", {})}
    return settings_of(measurement)


def cache_for(runnable: Runnable, measurement: dict[str, Any], case_cache: str) -> str:
    """The cache state ``runnable`` is measured in: its case's (``case_cache``), but a
    host stand-in's (``stand_ins.is_stand_in``) from ``measurement.interpret.cache`` where set."""
    if stand_ins.is_stand_in(runnable.execution):
        return measurement.get("interpret", {}).get("cache", case_cache)
    return case_cache


def host_floor(floor_path: str) -> float:
    """The host's noise floor from its record: every interval is at least this wide."""
    return records.read(floor_path, "noise_floor")["noise_floor"]


def host_peaks(floor_path: str) -> dict[str, Any] | None:
    """The host's own measured peaks, kept with its noise floor (None: a record made
    before they were measured)."""
    return records.read(floor_path, "noise_floor").get("peaks")


def measure(runnable: Runnable, make_inputs, measurement: dict[str, Any], cache_mode: str,
             seed: int, samples_path: str, floor: float | None,
             bound: dict[str, Any] | None = None,
             check: engine.Check | None = None,
             drawn: engine.Drawn | None = None) -> dict[str, Any]:
    """The engine's measurement and its samples table, or why none could be made;
    ``floor``: the host's noise floor the interval is widened to (None: not widened);
    ``bound``: the speed of light on this GPU (``speed_of_light``), below which a median
    is refused as impossible (its samples kept), and beside which it is recorded;
    ``check``: the oracle a timed call's output is held to (``verify.oracle_check``);
    ``drawn``: the first input set, already drawn from ``seed``."""
    settings = settings_for(runnable, measurement)
    try:
        result = engine.measure(engine.Workload(runnable, make_inputs, check, drawn), settings,
                                cache_mode, seed, engine.Devices.find())
    except guards.Unmeasurable as error:
        samples_file.write(samples_path, [])
        refusals = getattr(error, "refusals", {})  # the guards that caught a cheat
        return {"timed": False, "not_timed_reason": f"{records.REFUSED}: {error}",
                **({"refused_by": sorted(refusals)} if refusals else {})}
    samples_file.write(samples_path, result.rows)
    summary = {**result.summary(settings.confidence, floor), "samples_file": samples_path}
    if bound is None:
        return {"timed": True, "measurement": summary}
    why = speed_of_light.refusal(summary["median_s"], bound)
    if why:
        return {"timed": False, "not_timed_reason": f"{records.REFUSED}: {why}",
                "refused_by": ["speed_of_light"], "speed_of_light": bound}
    return {"timed": True, "measurement": summary, "speed_of_light": {
        **bound, "fraction": speed_of_light.fraction(summary["median_s"], bound)}}


def _kept(record: dict[str, Any]) -> dict[str, Any]:
    """``record``, also kept in its target's store of results across commits."""
    history.keep(record)
    return record


def verified(job: point_job.PointJob, verify_path: str) -> dict[str, Any]:
    """The verify record of ``job``'s variant, refused where it was made with another
    tile table than the one in use now."""
    checked = records.read(verify_path, "verify")
    if job.tiles_from != checked.get("tile_table"):
        raise CasebookError(verify_path, "tile_table", "verified with another tile table "
                            "than the one in use now; rerun verify")
    return checked


def time_kernel(case_dir: str, case: str, variant: str, point: str, target: str,
                settings: dict[str, Any], verify_path: str, floor_path: str, out: str,
                samples_path: str, shared_host: bool = False) -> dict[str, Any]:
    """Time one verified variant at one point; ``shared_host``: the job had fewer cores
    than a measurement takes, other jobs ran beside it (the record says so)."""
    job = point_job.load(case_dir, case, target, point, variant)
    checked = verified(job, verify_path)
    body: dict[str, Any] = {**job.stamp(), "verify_record": verify_path}
    if not checked["passed"]:
        samples_file.write(samples_path, [])
        why = (f"not run here: {checked['not_run_reason']}" if not checked["ran"] else
               "verification failed: " + "; ".join(checked["failures"]))
        return records.write(out, "time", {**body, "timed": False, "not_timed_reason": why})
    seed = verify.draw_seed()
    runnable = job.plugin.kernel(variant, job.tuned, "time", build_dir=job.build_dir)
    return _kept(records.write(out, "time", {
        **body, "seed": seed, "execution": runnable.execution, "shared_host": shared_host,
        **measure(runnable, lambda rng: job.plugin.make_inputs(job.tuned, rng), settings,
                  cache_for(runnable, settings, job.spec["measurement"]["cache"]), seed,
                  samples_path, host_floor(floor_path), speed_of_light.for_target(
                      job.plugin, job.tuned, job.plugin.outputs(variant), target,
                      host_peaks(floor_path)),
                  verify.oracle_check(job.plugin, job.tuned, job.spec, job.path, runnable))}))


def time_baseline(case_dir: str, case: str, baseline: str, point: str, target: str,
                  settings: dict[str, Any], floor_path: str, out: str,
                  samples_path: str) -> dict[str, Any]:
    job = point_job.load(case_dir, case, target, point)
    spec, path, params, plugin = job.spec, job.path, job.params, job.plugin
    entry = config.find(spec["baselines"], baseline, path, "baselines")
    body = {"target": target, "case": case, "baseline": baseline, "point": point,
            "role": entry["role"], "description": entry["description"], "params": params}
    try:
        runnable = plugin.baseline(baseline, params, build_dir=job.build_dir)
    except contract.NotRunnable as reason:
        samples_file.write(samples_path, [])
        return records.write(out, "baseline", {
            **body, "timed": False, "not_timed_reason": f"not run here: {reason}"})
    seed = verify.draw_seed()
    rng = np.random.default_rng(seed)
    inputs = plugin.make_inputs(params, rng)  # checked here, then the measurement's first set
    try:
        outputs = runnable.fetch(runnable.call(*runnable.prepare(engine.host_copy(inputs))))
    except Exception as error:  # only running out of memory is kept
        if not out_of_memory(error):
            raise
        said = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
        samples_file.write(samples_path, [])
        return records.write(out, "baseline", {
            **body, "seed": seed, "execution": runnable.execution, "timed": False,
            "not_timed_reason": f"{evidence.DOES_NOT_FIT}: {said}"})
    check = verify.check_outputs(
        params, inputs, outputs, plugin.oracle(params, inputs),
        verify.tolerance_of(spec, params, path), getattr(plugin, "compare", None))
    body.update(seed=seed, execution=runnable.execution, check=check)
    if not check["passed"]:
        samples_file.write(samples_path, [])
        return records.write(out, "baseline", {
            **body, "timed": False,
            "not_timed_reason": "the baseline disagrees with the oracle"})
    return _kept(records.write(out, "baseline", {
        **body, **measure(runnable, lambda rng: plugin.make_inputs(params, rng), settings,
                           spec["measurement"]["cache"], seed, samples_path,
                           host_floor(floor_path), speed_of_light.for_target(
                               plugin, params, plugin.baseline_outputs(baseline), target,
                               host_peaks(floor_path)),
                           verify.oracle_check(plugin, params, spec, path, runnable),
                           engine.Drawn(seed, inputs, rng))}))


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says the device (or the host, for a host baseline) ran out of
    memory: XLA's RESOURCE_EXHAUSTED, at compile or at run time, or a MemoryError."""
    return isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in str(error)


def computed_outputs(checks: list[dict[str, Any]]) -> frozenset[str]:
    """The named outputs a kernel or baseline was checked on (what it computes)."""
    return frozenset(name for check in checks for name in check.get("outputs", {}))


def comparable(times: dict[str, dict[str, Any]], verified: dict[str, dict[str, Any]],
               baselines: dict[str, dict[str, Any]], gpus: list[Any]
               ) -> list[dict[str, Any]]:
    """The (variant, baseline) pairs of one point worth a comparison, from their records:
    both timed, computing the same outputs (a backward pass is not set against a
    forward-only baseline). A pair that ran as different kinds of execution (an
    interpreted kernel against XLA on the host) is listed with ``why_not``: their host
    times are not one kind of speed."""
    pairs = []
    for variant, record in times.items():
        if not record["timed"]:
            continue
        computes = computed_outputs(verified[variant]["checks"])
        for name, base in baselines.items():
            if not base["timed"] or computed_outputs([base["check"]]) != computes:
                continue
            kinds = (evidence.subject(record["execution"], gpus),
                     evidence.subject(base["execution"], gpus))
            pairs.append({"variant": variant, "baseline": name, **(
                {} if kinds[0] == kinds[1] else {
                    "why_not": f"not compared: {variant} ran as {kinds[0]}, {name} as "
                               f"{kinds[1]}; their host times are not one kind of speed"})})
    return pairs


@dataclasses.dataclass(frozen=True)
class PointComparison:
    """One point's comparable pairs (``comparable``), read from its records."""

    case_dir: str
    case: str
    point: str
    target: str
    pairs: list[dict[str, Any]]
    times: dict[str, dict[str, Any]]

    @property
    def stands_in(self) -> bool:
        """Whether a host stand-in for a kernel (``stand_ins.is_stand_in``) is among those to
        measure (never pinned)."""
        return any(stand_ins.is_stand_in(self.times[p["variant"]]["execution"])
                   for p in self.pairs if "why_not" not in p)


def point_to_compare(case_dir: str, case: str, point: str, target: str) -> PointComparison:
    """The point's time, verify and baseline records and the pairs they make."""
    found = paths.point_records(config.load_case(case_dir, case), target, point)
    read = {kind: {name: records.read(path, kind) for name, path in named.items()}
            for kind, named in found.items()}
    gpus = records.read(paths.host_record(target), "host")["gpus"]
    return PointComparison(case_dir, case, point, target,
                           comparable(read["time"], read["verify"], read["baseline"], gpus),
                           read["time"])


def compare_point(compared: PointComparison, settings: dict[str, Any], floor_path: str,
                  out: str, samples_path: str) -> dict[str, Any]:
    """Stage: every comparable pair of the point, its variants and baselines measured
    interleaved in one measurement, each pair's speedup the median of its per-round
    ratios, judged against the host's paired floor; on a GPU, refused where a series'
    median beats its speed-of-light bound (``speed_of_light``)."""
    case_dir, case, target, point = (compared.case_dir, compared.case, compared.target,
                                     compared.point)
    pairs = [dict(p) for p in compared.pairs]
    job = point_job.load(case_dir, case, target, point)
    measured = [p for p in pairs if "why_not" not in p]
    floor = records.read(floor_path, "noise_floor")["paired"]["noise_floor"]
    body: dict[str, Any] = {"target": target, "case": case, "point": point,
                            "params": job.params, "paired_floor": floor}
    if not measured:
        samples_file.write_interleaved(samples_path, {})
        return records.write(out, "compare", {**body, "measured": False, "pairs": pairs})
    plugin, workloads, bounds, tiles = job.plugin, {}, {}, {}
    for name in dict.fromkeys(p["variant"] for p in measured):
        variant_job = point_job.load(case_dir, case, target, point, name)
        tuned = variant_job.tuned
        if variant_job.tiles_from:
            tiles[name] = variant_job.tiles_from
        runnable = plugin.kernel(name, tuned, "time", build_dir=job.build_dir)
        workloads[f"variant {name}"] = engine.Workload(
            runnable, lambda rng, tuned=tuned: plugin.make_inputs(tuned, rng),
            verify.oracle_check(plugin, tuned, job.spec, job.path, runnable))
        bounds[f"variant {name}"] = speed_of_light.for_target(
            plugin, tuned, plugin.outputs(name), target, host_peaks(floor_path))
    for name in dict.fromkeys(p["baseline"] for p in measured):
        runnable = plugin.baseline(name, job.params, build_dir=job.build_dir)
        workloads[f"baseline {name}"] = engine.Workload(
            runnable, lambda rng: plugin.make_inputs(job.params, rng),
            verify.oracle_check(plugin, job.params, job.spec, job.path, runnable))
        bounds[f"baseline {name}"] = speed_of_light.for_target(
            plugin, job.params, plugin.baseline_outputs(name), target, host_peaks(floor_path))
    # A host stand-in is only compared with its own kind (``comparable``), so the first
    # workload's settings and cache state are every workload's.
    first = next(iter(workloads.values())).runnable
    engine_settings = settings_for(first, settings)
    seed = verify.draw_seed()
    body.update(seed=seed, **({"tile_tables": tiles} if tiles else {}))
    try:
        result = engine.measure_interleaved(
            workloads, engine_settings,
            cache_for(first, settings, job.spec["measurement"]["cache"]), seed,
            engine.Devices.find())
    except guards.Unmeasurable as error:
        samples_file.write_interleaved(samples_path, {})
        why = f"{records.REFUSED}: {error}"
        return records.write(out, "compare", {
            **body, "measured": False, "not_measured_reason": why,
            "pairs": [{**p, "why_not": p.get("why_not", why)} for p in pairs]})
    samples_file.write_interleaved(samples_path, {name: m.rows for name, m in result.items()})
    impossible = [f"{name}: {why}" for name, m in result.items() if bounds[name] and (
        why := speed_of_light.refusal(m.summary(engine_settings.confidence)["median_s"],
                                      bounds[name]))]
    if impossible:  # faster than physics: refused, its samples kept
        why = f"{records.REFUSED}: " + "; ".join(impossible)
        return records.write(out, "compare", {
            **body, "measured": False, "not_measured_reason": why, "samples_file": samples_path,
            "pairs": [{**p, "why_not": p.get("why_not", why)} for p in pairs]})
    for p in measured:
        candidate = result[f"variant {p['variant']}"].kept_by_round
        reference = result[f"baseline {p['baseline']}"].kept_by_round
        cand, ref = stats.paired_rounds(candidate, reference)
        p.update(rounds=len(cand), **stats.compare_paired(
            cand, ref, engine_settings.confidence, floor).as_dict())
    return records.write(out, "compare", {
        **body, "measured": True, "pairs": pairs, "samples_file": samples_path,
        "measurement": {name: m.summary(engine_settings.confidence)
                        for name, m in result.items()}})


# A guard refusing one of casebook's own workloads (the A/A matmul, the peaks' matmul
# and copy: honest by construction) is a stall of a loaded host, not a cheat; such a
# measurement is made again, at most this many times, and the record lists each refusal.
OWN_WORKLOAD_RETRIES = 2


def _retried(measure: Callable[..., Any], refusals: list[str]) -> Callable[..., Any]:
    """``measure`` made again on a guard's refusal, OWN_WORKLOAD_RETRIES times at most;
    each refusal's message is added to ``refusals``."""
    def again(*args: Any) -> Any:
        for _ in range(OWN_WORKLOAD_RETRIES):
            try:
                return measure(*args)
            except guards.TimerFooled as error:
                refusals.append(str(error))
        return measure(*args)
    return again


def a_a_floor(measurement: dict[str, Any], refusals: list[str] | None = None
              ) -> dict[str, Any]:
    """The A/A protocols of ``measurement.noise_floor``, measured with the time stages'
    settings: separate measurements (the record's ``noise_floor``) and interleaved ones
    (``paired``). A guard's refusal of the A/A workload is retried (``_retried``) and
    added to ``refusals``."""
    settings = settings_of(measurement)
    spec = measurement["noise_floor"]
    devices = engine.Devices.find()
    workload = noise.matmul_workload(spec["size"])
    twin = noise.matmul_workload(spec["size"])  # A': the same computation, its own inputs
    refusals = [] if refusals is None else refusals

    def one(seed: int) -> engine.Measurement:
        return engine.measure(workload, settings, spec["cache"], seed, devices)

    def pair(seed: int) -> dict[str, engine.Measurement]:
        # Seeds apart from the separate protocol's, so no two series share inputs.
        return engine.measure_interleaved({"A": workload, "A'": twin}, settings,
                                          spec["cache"], 2 * spec["rounds"] + 2 * seed,
                                          devices)

    return {**noise.a_a(_retried(one, refusals), spec["rounds"], spec["quantile"]),
            "paired": noise.a_a_paired(_retried(pair, refusals), spec["rounds"],
                                       spec["quantile"])}


def noise_floor(target: str, measurement: dict[str, Any], out: str) -> dict[str, Any]:
    """Stage: this host's A/A noise floor record."""
    settings = settings_of(measurement)
    spec = measurement["noise_floor"]
    refusals: list[str] = []
    result = a_a_floor(measurement, refusals)
    measured = _retried(peaks.measure, refusals)(settings, 4 * spec["rounds"] + 1,
                                                  engine.Devices.find())
    return records.write(out, "noise_floor", {
        "target": target, "workload": f"jitted float32 matmul {spec['size']}×{spec['size']} "
                                      f"(jax.numpy.matmul)",
        "stop_criterion": settings.criterion, "stop_target": settings.target,
        "repeats": settings.repeats, "pinned_cpu": pinning.pinned_cpu(), **result,
        "peaks": measured, "guard_refusals_retried": refusals})
