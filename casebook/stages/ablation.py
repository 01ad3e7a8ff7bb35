"""The ablate stage: a verified variant with one part of its work switched off (the case
config's ``ablations``), lowered and timed at one point, to show where the time goes.

An ablation computes a wrong result on purpose, so it is never verified against the
oracle nor compared as a port. Its record keeps, beside its launches and its time, how
far one fresh draw of its outputs lies from the oracle, in tolerances: what switching
the part off changed, stated, never judged. It is timed only where its variant passed
verification at the point (an ablation of a failing kernel says nothing), and not at
all where the part is not in the kernel at that point (the plug-in's
``ablation_refusal``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from casebook.core import config, paths, provenance, records, speed_of_light
from casebook.core.errors import CasebookError
from casebook.measure import samples_file
from casebook.stages import point_job, timing, verify
from kernels import contract

NOT_A_VERIFICATION = ("one fresh draw against the oracle, stated, not judged: an "
                      "ablation computes a wrong result on purpose")


def run(case_dir: str, case: str, ablation: str, point: str, target: str,
        settings: dict[str, Any], verify_path: str, floor_path: str, out: str,
        samples_path: str, shared_host: bool = False) -> dict[str, Any]:
    """Lower and time ablation ``ablation`` at ``point``; write its record to ``out``.
    A failed lowering is recorded, then fails the job naming the point."""
    spec = paths.for_target(config.load_case(case_dir, case), target)
    declared = config.find(spec["ablations"], ablation, config.case_path(case_dir, case),
                           "ablations")
    job = point_job.load(case_dir, case, target, point, declared["of"])
    checked = timing.verified(job, verify_path)
    body: dict[str, Any] = {
        "target": target, "case": case, "ablation": ablation, "of": declared["of"],
        "switches_off": declared["switches_off"], "point": point, "params": job.params,
        "sources_sha256": provenance.job_sha256(spec, declared["of"], point,
                                                ablation=ablation),
        "verify_record": verify_path,
        **({"tile_table": job.tiles_from} if job.tiles_from else {})}
    why_not = job.plugin.ablation_refusal(ablation, job.tuned)
    if why_not:
        samples_file.write(samples_path, [])
        return records.write(out, "ablation", {**body, "applies": False,
                                               "not_applied_reason": why_not})
    body["applies"] = True
    # Made before the build: an interpreted kernel sizes the host backend it starts.
    runnable, why_not_timed = _runnable(job, ablation, checked)
    try:
        body["built"] = {"ok": True, **job.plugin.build(ablation, job.tuned,
                                                        build_dir=job.build_dir)}
    except Exception as error:  # recorded, then the job fails naming the point
        samples_file.write(samples_path, [])
        body["built"] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        records.write(out, "ablation", {**body, "timed": False,
                                        "not_timed_reason": "it did not build"})
        raise CasebookError(out, "built", f"{ablation} failed to build at {point}: "
                            f"{body['built']['error']}") from None
    if runnable is None:
        samples_file.write(samples_path, [])
        return records.write(out, "ablation", {**body, "timed": False,
                                               "not_timed_reason": why_not_timed})
    timed = _timed(job, runnable, settings, floor_path, samples_path, shared_host)
    record = records.write(out, "ablation", {**body, **timed})
    if timed.get("raised"):
        raise CasebookError(out, "raised", f"{ablation} raised at {point}: {timed['raised']}")
    return record


def _runnable(job: point_job.PointJob, ablation: str, checked: dict[str, Any]
              ) -> tuple[contract.Runnable | None, str | None]:
    """The ablation to time, or why it is not timed: its variant did not pass
    verification here, or it cannot run on this host."""
    if not checked["passed"]:
        return None, (f"not run here: {checked['not_run_reason']}" if not checked["ran"]
                      else f"{job.variant} failed verification at this point")
    try:
        return job.plugin.kernel(ablation, job.tuned, "time", build_dir=job.build_dir), None
    except contract.NotRunnable as reason:
        return None, f"not run here: {reason}"


def _timed(job: point_job.PointJob, runnable: contract.Runnable, settings: dict[str, Any],
           floor_path: str, samples_path: str, shared_host: bool) -> dict[str, Any]:
    """The ablation's draw against the oracle and its measurement."""
    seed = verify.draw_seed()
    inputs = job.plugin.make_inputs(job.tuned, np.random.default_rng(seed))
    drawn = verify.check_trial(runnable, job.plugin, job.tuned, inputs,
                               verify.tolerance_of(job.spec, job.tuned, job.path))
    if "outputs" not in drawn:  # it raised: recorded, then the job fails naming it
        samples_file.write(samples_path, [])
        return {"timed": False, "not_timed_reason": "it raised", "raised": drawn["error"]}
    worst = drawn.get("worst_error_over_tolerance")
    against = {"what": NOT_A_VERIFICATION, "seed": seed,
               "within_tolerance": drawn["passed"],
               # None where no finite ratio exists (a code that differs where exactness
               # is demanded, a non-finite output)
               "worst_error_over_tolerance": worst if worst is not None
               and math.isfinite(worst) else None,
               "nan_count": drawn.get("nan_count", 0),
               **({"error": drawn["error"]} if drawn.get("error") else {})}
    return {"against_oracle": against, "seed": seed, "execution": runnable.execution,
            "shared_host": shared_host,
            **timing.measure(runnable, lambda rng: job.plugin.make_inputs(job.tuned, rng),
                             settings, timing.cache_for(runnable, settings,
                                                        job.spec["measurement"]["cache"]),
                             seed, samples_path, timing.host_floor(floor_path),
                             speed_of_light.for_target(job.plugin, job.tuned,
                                                       job.plugin.outputs(job.variant),
                                                       job.target,
                                                       timing.host_peaks(floor_path)))}
