"""Stage 3, build: lower/compile a variant at one point, then gather its points.

Each point is its own job (``lower``), so that changing one point rebuilds that point
alone; build-only points (the sizes a user would publish) are lowered too. A point's
record is always written; then a failed point fails its job with a message naming it
(e.g. a configuration over the shared-memory budget). ``gather`` writes the variant's
build record from its points' records.
"""

from __future__ import annotations

from typing import Any

from casebook import cases, config, provenance, records, stage
from casebook.errors import CasebookError


def lower(case_dir: str, case: str, variant: str, point: str, target: str,
          out: str) -> dict[str, Any]:
    """Lower/compile ``variant`` at ``point``; write its lowering record to ``out``."""
    job = stage.load(case_dir, case, target, point, variant, build_only_points=True)
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
    record = records.write(out, "lowering", {
        "target": target, "case": case, "variant": variant, "point": point,
        "sources_sha256": provenance.job_sha256(job.spec, variant, point),
        "reference_source": {"file": reference and provenance.portable(reference),
                             "sha256": reference and provenance.file_sha256(reference)},
        "built": built,
    })
    if not built["ok"]:
        raise CasebookError(out, "built", f"{variant} failed to build at {point}: "
                            f"{built['error']}")
    return record


def gather(case_dir: str, case: str, variant: str, target: str, lowered: list[str],
           out: str) -> dict[str, Any]:
    """The build record of ``variant``: its points' lowering records, in config order."""
    spec = config.load_case(case_dir, case)
    parts = [records.read(p, "lowering") for p in lowered]
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
