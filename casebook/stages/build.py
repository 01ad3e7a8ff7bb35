"""The build stage: lower/compile a variant at its points, then gather them.

Each verified point is its own job (``lower``): its verify reads that point's lowering
alone, so changing one point rebuilds and reverifies that point only. The build-only
points (the sizes a user would publish, only lowered) of a variant are lowered in one job
(``lower_build_only``): one Python start and one jax import for all of them. A point's
record is always written; then a failed point fails its job with a message naming it
(e.g. a configuration over the shared-memory budget). ``gather`` writes the variant's
build record from its points' records.
"""

from __future__ import annotations

from typing import Any

from casebook.core import cases, config, paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.stages import point_job


def lower(case_dir: str, case: str, variant: str, point: str, target: str,
          out: str) -> dict[str, Any]:
    """Lower/compile ``variant`` at ``point``; write its lowering record to ``out``."""
    body = _lowering(case_dir, case, variant, point, target)
    record = records.write(out, "lowering", body)
    _fail_named(out, [record])
    return record


def lower_build_only(case_dir: str, case: str, variant: str, target: str,
                     out: str) -> dict[str, Any]:
    """Lower ``variant`` at every build-only point of the case, in config order; write
    their lowering records, together, to ``out``."""
    spec = paths.for_target(config.load_case(case_dir, case), target)
    points = [p["name"] for p in spec["build_only_points"]]
    if not points:
        raise CasebookError(config.case_path(case_dir, case), "build_only_points",
                            "no build-only points to lower")
    lowered = [records.stamp("lowering", _lowering(case_dir, case, variant, point, target,
                                                   build_only=True))
               for point in points]
    record = records.write(out, "lowerings", {"target": target, "case": case,
                                              "variant": variant, "lowerings": lowered})
    _fail_named(out, lowered)
    return record


def _fail_named(out: str, lowered: list[dict[str, Any]]) -> None:
    """Fail the job naming each point that did not build (its record is written)."""
    failed = [f"{r['variant']} failed to build at {r['point']}: {r['built']['error']}"
              for r in lowered if not r["built"]["ok"]]
    if failed:
        raise CasebookError(out, "built", "; ".join(failed))


def _lowering(case_dir: str, case: str, variant: str, point: str, target: str,
              build_only: bool = False) -> dict[str, Any]:
    """The lowering record's body of ``variant`` at ``point`` (verified, or build-only
    with ``build_only``); a failed lowering is recorded, never raised."""
    job = point_job.load(case_dir, case, target, point, variant, build_only_points=build_only)
    if job.build_only != build_only:
        raise CasebookError(job.path, "points", f"{point} is "
                            f"{'not ' if build_only else ''}a build-only point")
    reference = job.plugin.reference_file()
    why_not = cases.refusal(job.plugin, job.tuned)
    built: dict[str, Any] = {"point": point, "params": job.params,
                             "build_only": job.build_only,
                             **({"tile_table": job.tiles_from} if job.tiles_from else {})}
    if why_not:
        built.update(ok=False, error=why_not)
    else:
        try:
            built.update(ok=True, **job.plugin.build(variant, job.tuned,
                                                     build_dir=job.build_dir))
        except Exception as error:  # recorded, then the job fails naming the point
            built.update(ok=False, error=f"{type(error).__name__}: {error}")
    return {
        "target": target, "case": case, "variant": variant, "point": point,
        "sources_sha256": provenance.job_sha256(job.spec, variant, point),
        "reference_source": {"file": reference and provenance.portable(reference),
                             "sha256": reference and provenance.file_sha256(reference)},
        "built": built,
    }


def gather(case_dir: str, case: str, variant: str, target: str, lowered: list[str],
           out: str) -> dict[str, Any]:
    """The build record of ``variant``: its points' lowering records (and the record of
    its build-only points' lowerings, last), in config order."""
    spec = paths.for_target(config.load_case(case_dir, case), target)
    parts = [part for path in lowered for part in _lowerings(path)]
    sources = {tuple(p["reference_source"].values()) for p in parts}
    if len(sources) != 1:
        raise CasebookError(lowered[0], "reference_source", "the points were lowered "
                            "against different reference sources; rerun the build")
    points = [p["built"] for p in parts]
    return records.write(out, "build", {
        "target": target, "case": case, "variant": variant,
        "sources_sha256": provenance.job_sha256(spec, variant),
        "reference_source": parts[0]["reference_source"],
        "points": points,
        "ok": all(p["ok"] for p in points),
    })


def _lowerings(path: str) -> list[dict[str, Any]]:
    """The lowering records in one file: a point's, or a variant's build-only points'."""
    if path.endswith(paths.BUILD_ONLY_SUFFIX):
        return records.read(path, "lowerings")["lowerings"]
    return [records.read(path, "lowering")]
