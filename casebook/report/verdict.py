"""How a run ends: the site is rendered either way; then one line names every point that
failed verification and every measurement a guard refused, and either makes the run
exit non-zero (config ``fail_on_failures``), so make, CI and a cluster job see what the
pages show; a case page that failed to render (its inputs did not read back) is named
too, and always fails the run. A refusal fails the run as a failed verification does:
the reuse guard re-checks before it refuses, and benchmarks/reuse_guard_load.py measures
how rarely the guards accuse honest code on a loaded host.

``python -m casebook.report.verdict`` gives the same verdict on the records as they stand (what
``make`` runs after Snakemake, which says nothing when it had nothing to do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from casebook.core import config, paths, records
from casebook.core.errors import CasebookError
from casebook.stages import hostcapture


def _read(path: str, kind: str) -> dict[str, Any] | None:
    return records.read(path, kind) if Path(path).exists() else None


def _refused(path: str, kind: str) -> bool:
    """Whether the time, ablation or baseline record at ``path`` says a guard refused it."""
    timed = _read(path, kind)
    return (bool(timed) and timed.get("timed") is False
            and timed["not_timed_reason"].startswith(records.REFUSED))


def findings(specs: dict[str, dict[str, Any]], targets: list[str]) -> dict[str, list[str]]:
    """target/case/variant/point of each failed verification, and of each kernel,
    ablation, baseline or interleaved comparison measurement a guard refused, in the records of
    ``targets``; each case whose page failed to render, with the error."""
    failed, refused = [], []
    for target in targets:
        for case, spec in specs.items():
            for point in (p["name"] for p in paths.for_target(spec, target)["points"]):
                for variant in (v["name"] for v in spec["variants"]):
                    where = f"{target}/{case}/{variant}/{point}"
                    checked = _read(paths.verify_record(target, case, variant, point),
                                    "verify")
                    if checked and checked["ran"] and not checked["passed"]:
                        failed.append(where)
                    if _refused(paths.time_record(target, case, variant, point), "time"):
                        refused.append(where)
                for name in (a["name"] for a in spec.get("ablations", [])):
                    if _refused(paths.ablation_record(target, case, name, point), "ablation"):
                        refused.append(f"{target}/{case}/ablation {name}/{point}")
                for name in (b["name"] for b in spec["baselines"]):
                    if _refused(paths.baseline_record(target, case, name, point), "baseline"):
                        refused.append(f"{target}/{case}/baseline {name}/{point}")
                compared = _read(paths.compare_record(target, case, point), "compare")
                if compared and compared.get("not_measured_reason", "").startswith(
                        records.REFUSED):
                    refused.append(f"{target}/{case}/compare/{point}")
    pages = [f"{case} ({page['error']})" for case in specs
             if (page := _read(paths.page_status(case), "page")) and not page["ok"]]
    return {"failed": failed, "refused": refused, "pages": pages}


def summary(found: dict[str, list[str]]) -> str | None:
    """One line, or None when nothing failed and nothing was refused."""
    parts = []
    if found["failed"]:
        parts.append(f"{len(found['failed'])} point(s) failed verification: "
                     + ", ".join(found["failed"]))
    if found["refused"]:
        parts.append(f"{len(found['refused'])} measurement(s) refused by a guard: "
                     + ", ".join(found["refused"]))
    if found["pages"]:
        parts.append(f"{len(found['pages'])} page(s) failed to render: "
                     + ", ".join(found["pages"]))
    return "casebook: " + "; ".join(parts) + " (the site shows them)" if parts else None


def finish(specs: dict[str, dict[str, Any]], targets: list[str], fail: bool) -> None:
    """Print the verdict's line to stderr; exit 1 when a verification failed or a guard
    refused a measurement, and ``fail``; and whenever a page failed to render (the site
    is not whole)."""
    found = findings(specs, targets)
    line = summary(found)
    if line:
        print(line, file=sys.stderr)
    if ((found["failed"] or found["refused"]) and fail) or found["pages"]:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m casebook.report.verdict", description=__doc__)
    parser.add_argument("--configfile", action="append", default=[],
                        help="a config overlay, as given to snakemake (repeatable)")
    args = parser.parse_args(argv)
    try:
        settings = config.load_global(args.configfile)
        specs = {name: config.load_case(settings["case_dir"], name)
                 for name in settings["cases"]}
        finish(specs, hostcapture.measured_targets(settings), settings["fail_on_failures"])
    except CasebookError as error:
        sys.exit(f"casebook: error: {error}")


if __name__ == "__main__":
    main()
