"""Stage 3, build: lower/compile every point of a variant and record what was built.

Build-only points (the sizes a user would publish) are lowered too. The record is always
written; then a failed point fails the stage with a message naming it (e.g. a
configuration over the shared-memory budget).
"""

from __future__ import annotations

from typing import Any

from casebook import cases, config, provenance, records, tile_table
from casebook.errors import CasebookError


def run(case_dir: str, case: str, variant: str, target: str, out: str) -> dict[str, Any]:
    spec = config.load_case(case_dir, case)
    path = config.case_path(case_dir, case)
    config.find(spec["variants"], variant, path, "variants")
    plugin = cases.load(case)
    reference = plugin.reference_file()
    points = []
    grid = [(p, False) for p in spec["points"]] + [(p, True) for p in spec["build_only_points"]]
    for point, build_only in grid:
        params, tiles_from = tile_table.apply(target, case, variant, point["name"], point["params"])
        why_not = plugin.check_params(params)
        entry: dict[str, Any] = {"point": point["name"], "params": point["params"],
                                 "build_only": build_only,
                                 **({"tile_table": tiles_from} if tiles_from else {})}
        if why_not:
            entry.update(ok=False, error=why_not)
        else:
            try:
                entry.update(ok=True, **plugin.build(variant, params))
            except Exception as error:  # recorded, then the stage fails naming the point
                entry.update(ok=False, error=f"{type(error).__name__}: {error}")
        points.append(entry)
    record = records.write(out, "build", {
        "target": target, "case": case, "variant": variant,
        "sources_sha256": provenance.case_sources_sha256(case, path),
        "reference_source": {"file": reference,
                             "sha256": reference and provenance.file_sha256(reference)},
        "points": points,
        "ok": all(p["ok"] for p in points),
    })
    failed = [f"{p['point']}: {p['error']}" for p in points if not p["ok"]]
    if failed:
        raise CasebookError(out, "points", f"{variant} failed to build at {len(failed)} "
                            f"point(s): " + "; ".join(failed))
    return record
