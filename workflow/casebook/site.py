"""Stage 8, site: static pages rendered from figure sidecars and records.

Every figure shown is read back through the schema: a sidecar missing a condition
stops the page with a message naming the file and the field.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from casebook import conditions, config, figures, fmt, paths, records, status
from casebook.evidence import Evidence, gather


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(paths.TEMPLATE_DIR),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True)


def _write(path: str, html: str) -> None:
    records.atomic_write_text(path, html)


def _verify_table(ev: Evidence) -> str:
    rows = [{"variant": v, "point": p, "passed": r["passed"], "trials": r["trials"],
             "max |error|": f"{r['max_abs_error']:.3g}",
             "worst error / tolerance": (f"{r['worst_error_over_tolerance']:.3g}"
                                         if r["worst_error_over_tolerance"] is not None
                                         else "—"),
             "races": r["races_found"]} for (v, p), r in ev.verify.items()]
    return pd.DataFrame(rows).to_html(index=False, classes="results", border=0) if rows else ""


def _build_table(ev: Evidence) -> str:
    rows = [{"variant": r["variant"], "point": r["point"],
             "run here": "no (build only)" if r["build_only"] else "yes (interpreter)",
             "target": r["target"], "grid": " × ".join(map(str, r["grid"])),
             "block": " × ".join(map(str, r["block"])),
             "shared memory": f"{r['dynamic_smem_bytes']:,} B of {r['smem_limit_bytes']:,}",
             "tiles": ", ".join(f"{k} {v}" for k, v in r.get("tuning", {}).items()),
             "partial blocks from": r.get("mask_source", "—")}
            for r in figures.lowered_launches(ev)]
    return pd.DataFrame(rows).to_html(index=False, classes="results", border=0) if rows else ""


def _timing_table(ev: Evidence) -> str:
    rows = []
    for (name, point), record in [*ev.time.items(), *ev.baselines.items()]:
        m = record.get("measurement")
        rows.append({"what": name, "point": point,
                     "median": fmt.seconds(m["median_s"]) if m else "not timed",
                     "interval": f"{fmt.seconds(m['ci_low_s'])} – {fmt.seconds(m['ci_high_s'])}"
                     f" ({m['confidence']:.0%})" if m else record.get("not_timed_reason", "—"),
                     "samples": m["samples"] if m else 0,
                     "noise": f"{m['relative_noise']:.1%}" if m else "—",
                     "stopped by": f"{m['stop_criterion']}: {m['stop_reason']}" if m else "—",
                     "clock": m["clock_kind"] if m else "—",
                     "cache": m["cache"]["mode"] if m else "—",
                     "throttled (discarded)": m["throttling"]["discarded"] if m else "—",
                     "noise floor": (f"±{ev.noise_floor['noise_floor']:.1%}"
                                     if ev.noise_floor else "none recorded")})
    return pd.DataFrame(rows).to_html(index=False, classes="results", border=0) if rows else ""


def _comparison_table(ev: Evidence) -> str:
    rows = [{"kernel": variant, "baseline": name, "point": point,
             "verdict": c.verdict, "speedup": conditions.comparison_text(c)}
            for (variant, name, point), c in conditions.comparisons(ev).items()]
    return pd.DataFrame(rows).to_html(index=False, classes="results", border=0) if rows else ""


def _target_section(spec: dict[str, Any], case_path: Path, target: str,
                    local_target: str) -> dict[str, Any]:
    ev = gather(spec, case_path, target, must_exist=target == local_target)
    manifest = records.read(paths.figure_manifest(spec["name"], target), "manifest")
    figures = []
    for name in manifest["figures"]:
        svg = paths.figure(spec["name"], target, name)
        sidecar = records.read(paths.sidecar(svg), "figure")
        published = Path(paths.SITE) / "figures" / spec["name"] / target / Path(svg).name
        published.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(svg, published)
        figures.append({**sidecar, "src": published.relative_to(paths.SITE).as_posix()})
    failures = [f"{v} @ {p}: {f}" for (v, p), r in ev.verify.items() for f in r["failures"]]
    return {"target": target, "status": status.line(ev), "figures": figures,
            "withheld": manifest["withheld"], "failures": failures,
            "verify_table": _verify_table(ev), "build_table": _build_table(ev),
            "timing_table": _timing_table(ev),
            "comparison_table": _comparison_table(ev), "noise_floor": conditions.floor_text(ev),
            "stale": ev.stale}


def case_page(case_dir: str, case: str, targets: list[str], local_target: str,
              title: str) -> None:
    spec = config.load_case(case_dir, case)
    case_path = config.case_path(case_dir, case)
    sections = [_target_section(spec, case_path, t, local_target) for t in targets]
    html = _environment().get_template("case.html").render(
        site_title=title, spec=spec, sections=sections, headings=conditions.HEADINGS)
    _write(paths.site_page(case), html)


def index(case_dir: str, cases: list[str], targets_of: dict[str, list[str]],
          local_target: str, title: str) -> None:
    cards = []
    for case in cases:
        spec = config.load_case(case_dir, case)
        case_path = config.case_path(case_dir, case)
        statuses = []
        for target in targets_of[case]:
            ev = gather(spec, case_path, target, must_exist=target == local_target)
            statuses.append({"target": target, "line": status.line(ev),
                             "commit": ev.env["commit"], "date": ev.env["created_at"]})
        cards.append({"spec": spec, "page": Path(paths.site_page(case)).name,
                      "statuses": statuses})
    static = Path(paths.SITE) / "static"
    static.mkdir(parents=True, exist_ok=True)
    for asset in paths.STATIC_DIR.iterdir():
        shutil.copyfile(asset, static / asset.name)
    _write(paths.site_index(), _environment().get_template("index.html").render(
        site_title=title, cards=cards))
