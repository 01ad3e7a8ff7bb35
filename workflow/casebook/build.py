"""Stage 3, build: lower/compile every point of a variant and record what was built."""

from __future__ import annotations

from typing import Any

from casebook import cases, config, provenance, records


def run(case_dir: str, case: str, variant: str, target: str, out: str) -> dict[str, Any]:
    spec = config.load_case(case_dir, case)
    path = config.case_path(case_dir, case)
    config.find(spec["variants"], variant, path, "variants")
    plugin = cases.load(case)
    reference = plugin.reference_file()
    points = []
    for point in spec["points"]:
        why_not = plugin.check_params(point["params"])
        entry: dict[str, Any] = {"point": point["name"], "params": point["params"]}
        if why_not:
            entry.update(ok=False, error=why_not)
        else:
            try:
                entry.update(ok=True, **plugin.build(variant, point["params"]))
            except Exception as error:  # a build failure is a result, shown on the page
                entry.update(ok=False, error=f"{type(error).__name__}: {error}")
        points.append(entry)
    return records.write(out, "build", {
        "target": target, "case": case, "variant": variant,
        "sources_sha256": provenance.files_sha256(
            [*provenance.kernel_sources(case), path]),
        "reference_source": {"file": reference, "sha256": provenance.file_sha256(reference)},
        "points": points,
        "ok": all(p["ok"] for p in points),
    })
