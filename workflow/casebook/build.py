"""Stage 3, build: lower/compile a variant at one point, then gather its points.

Each point is its own job (``lower``), so that changing one point rebuilds that point
alone; build-only points (the sizes a user would publish) are lowered too. A point's
record is always written; then a failed point fails its job with a message naming it
(e.g. a configuration over the shared-memory budget). ``gather`` writes the variant's
build record from its points' records.
"""

from __future__ import annotations

from typing import Any

from casebook import cases, config, paths, provenance, records, tile_table
from casebook.errors import CasebookError


def _point(spec: dict[str, Any], point: str, path: object) -> tuple[dict[str, Any], bool]:
    """The config entry of ``point`` and whether it is build-only."""
    for entry in spec["points"]:
        if entry["name"] == point:
            return entry, False
    return config.find(spec["build_only_points"], point, path, "build_only_points"), True


def lower(case_dir: str, case: str, variant: str, point: str, target: str,
          out: str) -> dict[str, Any]:
    """Lower/compile ``variant`` at ``point``; write its lowering record to ``out``."""
    spec = config.load_case(case_dir, case)
    path = config.case_path(case_dir, case)
    config.find(spec["variants"], variant, path, "variants")
    entry, build_only = _point(spec, point, path)
    plugin = cases.load(case)
    reference = plugin.reference_file()
    params, tiles_from = tile_table.apply(target, case, variant, point, entry["params"])
    why_not = cases.refusal(plugin, params)
    built: dict[str, Any] = {"point": point, "params": entry["params"],
                             "build_only": build_only,
                             **({"tile_table": tiles_from} if tiles_from else {})}
    if why_not:
        built.update(ok=False, error=why_not)
    else:
        try:
            built.update(ok=True, **plugin.build(variant, params,
                                                 build_dir=paths.build_dir(case)))
        except Exception as error:  # recorded, then the job fails naming the point
            built.update(ok=False, error=f"{type(error).__name__}: {error}")
    record = records.write(out, "lowering", {
        "target": target, "case": case, "variant": variant, "point": point,
        "sources_sha256": provenance.job_sha256(spec, variant, point),
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
