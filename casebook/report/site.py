"""The site stage: static pages rendered from figure sidecars and records.

Each part of the site (a case's page, the index, the methods page, the static assets) is
rendered into its own folder under build/site/, laid out as the site; ``publish_site``
merges the parts into a new folder and puts it in place of site/public/ whole, so the
published site is never half-made. Every figure shown is read back through the schema: a
sidecar missing a condition, a corrupt manifest or record, renders the case's page as
failed with the error (the index says so too), never a dead link. The site is
self-contained: figures, style and every raw record and sample file a page links to
are copied into it, so it works opened from disk and needs no network.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
import shutil
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from casebook.core import config, files, paths, records
from casebook.core.errors import CasebookError
from casebook.report import conditions, history, methods, page_tables, status
from casebook.report.evidence import Evidence, gather
from casebook.stages import hostcapture

Publish = Callable[[str], str | None]


def _code(text: str) -> markupsafe.Markup:
    """Escaped text whose ``literals`` (docstring style) are set as code."""
    escaped = str(markupsafe.escape(text))
    return markupsafe.Markup(re.sub(r"``(.+?)``", r"<code>\1</code>", escaped))


def _when(iso: str) -> str:
    return dt.datetime.fromisoformat(iso).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(paths.TEMPLATE_DIR),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True)
    env.filters.update(code=_code, when=_when)
    return env


def _render(out: str, template: str, **context: Any) -> None:
    html = _environment().get_template(template).render(**context)
    files.atomic_write_text(out, html)


def publish(result: str, root: str) -> str | None:
    """Copy a file under results/ into the site part at ``root``; its link from a page,
    or None if absent. A target's shared records (``paths.target_records``) are the
    records part's alone: linked, never copied here."""
    if not Path(result).exists():
        return None
    published = paths.site_data(result, root)
    if result not in paths.target_records(Path(result).relative_to(paths.RESULTS).parts[0]):
        Path(published).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(result, published)
    return paths.site_href(published, root)


def _made(ev: Evidence) -> dict[str, str]:
    """When and from which commit a case's records on one target were made."""
    made = [*ev.builds.values(), *ev.verify.values(), *ev.time.values(),
            *ev.baselines.values()] or [ev.env]
    latest = max(made, key=lambda r: dt.datetime.fromisoformat(r["created_at"]))
    commits = sorted({r["commit"] for r in made})
    return {"date": latest["created_at"], "commits": commits}


def _failures(ev: Evidence) -> list[str]:
    found = [f"{v} @ {p}: {f}" for (v, p), r in ev.verify.items() for f in r["failures"]]
    found += [f"build of {v} failed at " + ", ".join(p["point"] for p in b["points"]
                                                       if not p["ok"])
              for v, b in ev.builds.items() if not b["ok"]]
    found += [f"baseline {name} @ {p}: {r['not_timed_reason']}"
              for (name, p), r in ev.baselines.items()
              if not r["timed"] and not r["not_timed_reason"].startswith("not run here")]
    return found


# Lines never folded away: failures, drift, staleness and weak checks (bad); warnings.
ALARMS = {"bad": re.compile(r"FAILED|STALE|DRIFT|WEAK"), "warn": re.compile(r"WARNING|NOT GPU")}
SHOWN_LINES = 1  # lines of each condition shown before "more": enough to identify it


def panel(six: dict[str, list[str]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Each condition's lines split into those always shown and those folded.

    The first lines and every alarming line are shown; the rest fold under "more".
    """
    split = {}
    for key, lines in six.items():
        marked = [{"text": text, "alarm": next((tone for tone, pattern in ALARMS.items()
                                                 if pattern.search(text)), None)}
                  for text in lines]
        split[key] = {
            "shown": [m for i, m in enumerate(marked) if i < SHOWN_LINES or m["alarm"]],
            "more": [m for i, m in enumerate(marked) if i >= SHOWN_LINES and not m["alarm"]]}
    return split


def _figures(case: str, target: str, manifest: dict[str, Any], root: str,
             publish: Publish) -> list[dict[str, Any]]:
    figures = []
    for name in manifest["figures"]:
        svg = paths.figure(case, target, name)
        sidecar_path = paths.sidecar(svg)
        sidecar = records.read(sidecar_path, "figure")
        if not Path(svg).is_file():
            manifest_path = paths.figure_manifest(case, target)
            raise CasebookError(svg, None, f"missing, though {manifest_path} lists it; "
                                f"{records.recovery(manifest_path)}")
        published = paths.site_figure(case, target, name, root)
        Path(published).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(svg, published)
        figures.append({**sidecar, "src": paths.site_href(published, root),
                        "sidecar_href": publish(sidecar_path),
                        "panel": panel(sidecar["conditions"]),
                        "caption_parts": lead_sentence(sidecar["caption"]),
                        "anchor": f"{target}-{name}"})
    return figures


def lead_sentence(caption: str) -> tuple[str, str]:
    """``caption`` as its first sentence, shown, and the rest, folded ("" if none)."""
    lead, dot, rest = caption.partition(". ")
    return (lead + dot.strip(), rest.strip())


def _raw_records(ev: Evidence, manifest_path: str,
                 publish: Publish) -> list[dict[str, str | None]]:
    listed = [("environment", paths.env_record(ev.target)),
              ("host", paths.host_record(ev.target)),
              *((f"build: {v}", paths.build_record(ev.target, ev.case, v))
                for v in ev.builds),
              ("figure manifest", manifest_path),
              *([("tile table", paths.tile_table(ev.target, ev.case))]
                if "autotune" in ev.spec else [])]
    return [{"label": label, "name": Path(path).name, "href": publish(path)}
            for label, path in listed]


def tile_note(spec: dict[str, Any], ev: Evidence) -> str | None:
    """Where this target's tiles came from, for a case whose tile choice is autotuned."""
    if "autotune" not in spec:
        return None
    untuned = ("the case config's tile rows where a point gives them, else the kernel's own "
               "choice (the port's: a budget rule, or tiles chosen by hand; a reference's: "
               "its default) — not autotuned")
    if any(choice.get("pick") for choice in ev.tile_choices.values()):
        return (f"Tiles on {ev.target}: the case config's rows where a point gives them, "
                f"else the pick of the point's own autotune (``snakemake autotune``; its "
                f"record under “Tile choice (autotune)”), else the kernel's own choice.")
    if ev.tile_choices:
        return (f"Tile choice on {ev.target}: {untuned} (autotune ran, and no candidate "
                f"passed verification and was timed).")
    return f"Tile choice on {ev.target}: {untuned} (no autotune run on it yet)."


def _bit_exact(spec: dict[str, Any], target: str, href: page_tables.Href) -> str:
    """The bit-exact record's table, where the target has one."""
    path = paths.bit_exact_record(target, spec["name"])
    record = records.read(path, "bit_exact") if Path(path).exists() else None
    return page_tables.bit_exact(record, href, path)


def _target_section(spec: dict[str, Any], target: str, measured: Collection[str],
                    root: str) -> tuple[dict[str, Any], Evidence]:
    """The page's section of ``target``, and the evidence it was made from."""
    manifest_path = paths.figure_manifest(spec["name"], target)
    manifest = records.read(manifest_path, "manifest")
    ev = gather(spec, target, must_exist=target in measured)
    publish_here = functools.partial(publish, root=root)
    return {
        "target": target, "hardware": status.hardware(ev), "status": status.parts(ev),
        "made": _made(ev), "interpreted": ev.interpreted,
        "interpreted_timed": ev.interpreted_timed,
        "figures": _figures(spec["name"], target, manifest, root, publish_here),
        "withheld": manifest["withheld"], "failures": _failures(ev), "stale": ev.stale,
        "tables": {"Verification": page_tables.verification(ev, publish_here),
                   "Lowering (compiled on this host, not run)": page_tables.lowering(ev),
                   "The port against the kernel it ports, from the two binaries":
                       page_tables.side_by_side(ev, spec),
                   "The port against the kernel it ports, bit for bit":
                       _bit_exact(spec, target, publish_here),
                   "Timing": page_tables.timing(ev, publish_here),
                   "Kernel against baselines": page_tables.comparisons(ev),
                   "Tile choice (autotune)": page_tables.tile_choices(ev, publish_here),
                   "History across commits (each against the one before)":
                       page_tables.across_commits(history.steps(target, spec["name"]))},
        "tile_note": tile_note(spec, ev),
        "noise_floor": conditions.floor_text(ev),
        "command": conditions.command(ev),
        "raw": _raw_records(ev, manifest_path, publish_here)}, ev


def never_run(evs: list[Evidence]) -> list[dict[str, Any]]:
    """The device classes a case's kernels were built for on which none has run: an
    architecture the builds of ``evs`` (one per target with records) lowered for, none of
    whose classes (``hostcapture.ARCH_CLASSES``) is among those targets. Each with its
    variants and the targets that lowered them, and a status that says so."""
    have = {ev.target for ev in evs}
    built: dict[str, dict[str, set[str]]] = {}
    for ev in evs:
        for variant, build in ev.builds.items():
            for point in build["points"]:
                for artifact in point.get("artifacts", []):
                    arch = artifact["target"].removeprefix("cuda ")
                    if arch in hostcapture.ARCH_CLASSES:
                        found = built.setdefault(arch, {})
                        found.setdefault(variant, set()).add(ev.target)
    rows = []
    for arch, variants in sorted(built.items()):
        classes = hostcapture.ARCH_CLASSES[arch]
        if have & set(classes):
            continue
        lowered_on = sorted({t for on in variants.values() for t in on})
        for cls in classes:
            text = (f"{', '.join(sorted(variants))} lowered for {arch} on "
                    f"{', '.join(lowered_on)}, never run on a {cls.upper()}: no record")
            rows.append({"target": cls, "hardware": f"no {cls.upper()} has run this case",
                         "status": [{"text": text, "tone": "warn"}],
                         "made": {"date": None, "commits": []}})
    return rows


def case_page(case_dir: str, case: str, targets: list[str], measured: Collection[str],
              title: str, root: str, status_path: str) -> None:
    """One case's page in the site part at ``root``: a section per target (``measured``:
    the targets this run made). Bad input (a corrupt record, manifest or sidecar) renders
    the page as failed with the error instead; ``status_path`` records which it was."""
    spec = config.load_case(case_dir, case)
    try:
        made = [_target_section(spec, t, measured, root) for t in targets]
        sections = [section for section, _ in made]
        evs = [ev for _, ev in made]
        unrun = never_run(evs)
        glance = {"device": page_tables.summary(evs, on_device=True),
                  "host": page_tables.summary(evs, on_device=False),
                  "across_chips": page_tables.across_chips(evs, spec)}
    except CasebookError as failure:
        shutil.rmtree(root, ignore_errors=True)  # figures and records copied so far
        error = str(failure)
        sys.stderr.write(f"casebook: the page of {case} is rendered as failed: {error}\n")
        _render(paths.site_page(case, root), "failed.html", site_title=title, spec=spec,
                error=error, page="case")
    else:
        error = None
        _render(paths.site_page(case, root), "case.html", site_title=title, spec=spec,
                sections=sections, never_run=unrun, headings=conditions.HEADINGS, glance=glance,
                points=page_tables.points(spec), page="case")
    records.write(status_path, "page", {"case": case, "ok": error is None, "error": error})


def index(case_dir: str, cases: list[str], targets_of: dict[str, list[str]],
          measured: Collection[str], title: str, root: str,
          statuses: dict[str, str]) -> None:
    """The index in the site part at ``root``: one matrix, a row per case and a column per
    target, each cell a few badges (``status.badges``) linking to the case page's section;
    ``statuses``: each case's page record."""
    cards, columns = [], ["cpu"]
    for case in cases:
        spec = config.load_case(case_dir, case)
        page = records.read(statuses[case], "page")
        cells, evs = {}, []
        for target in targets_of[case] if page["ok"] else []:
            ev = gather(spec, target, must_exist=target in measured)
            evs.append(ev)
            cells[target] = {"hardware": status.hardware(ev), "badges": status.badges(ev),
                             "made": _made(ev)}
        for row in never_run(evs):
            cells[row["target"]] = {"hardware": row["hardware"], "made": row["made"],
                                    "badges": [{"text": "never run", "tone": "warn",
                                                "title": row["status"][0]["text"]}]}
        columns += [t for t in cells if t not in columns]
        cards.append({"spec": spec, "page": paths.site_href(paths.site_page(case)),
                      "cells": cells, "error": page["error"]})
    _render(paths.site_index(root), "index.html", site_title=title, cards=cards,
            columns=columns, page="index")


def target_records(targets: list[str], root: str) -> None:
    """Each target's shared records (environment, host, noise floor: every page links
    them), copied into the site part at ``root`` once."""
    for target in targets:
        for record in paths.target_records(target):
            if Path(record).exists():
                published = paths.site_data(record, root)
                Path(published).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(record, published)


def static_assets(root: str) -> None:
    """The style sheet and script, copied into the site part at ``root``."""
    for asset in sorted(paths.STATIC_DIR.iterdir()):
        files.atomic_write_text(paths.site_static(asset.name, root), asset.read_text())


def methods_page(case_dir: str, cases: list[str], targets: list[str],
                 measured: Collection[str],
                 title: str, protocol: dict[str, Any], root: str) -> None:
    """The methods page in the site part at ``root``."""
    specs = [config.load_case(case_dir, case) for case in cases]
    by_target = {t: [gather(s, t, must_exist=t in measured) for s in specs]
                 for t in targets}
    publish_here = functools.partial(publish, root=root)
    evidence = [ev for evs in by_target.values() for ev in evs]
    hosts = [{**methods.noise_floor(t, evs, publish_here),
              "hardware": status.hardware(evs[0]),
              "host_href": publish_here(paths.host_record(t))}
             for t, evs in by_target.items()]
    _render(
        paths.site_methods(root), "methods.html", site_title=title, page="methods",
        headings=conditions.HEADINGS, verification=methods.verification_rules(),
        measurement=methods.measurement_rules(),
        tolerances=page_tables.frame([r for s in specs for r in methods.tolerance_rows(s)],
                                "tolerances"),
        protocol=page_tables.frame([{"setting": k, "value": str(v)} for k, v in protocol.items()],
                              "protocol"),
        stops=page_tables.frame(methods.stop_rows(evidence), "stops"),
        protocol_checks=page_tables.frame(methods.protocol_checks(), "protocol-checks"),
        executions=page_tables.frame(methods.execution_rows(evidence), "executions"),
        hosts=hosts)


# Snakemake's stamp of a folder output: kept out of the published site.
_SNAKEMAKE_STAMP = ".snakemake_timestamp"


def publish_site(parts: list[str], site: str) -> None:
    """Merge the rendered ``parts`` into a new folder, then put it in place of ``site``.

    Each file comes from one part (two parts holding one file is an error: each file of
    the site has one rule that makes it). The old site is renamed away only once the new
    one is complete; a run killed in between leaves one of the two whole beside
    ``site``."""
    new, old = Path(f"{site}.new"), Path(f"{site}.old")
    shutil.rmtree(new, ignore_errors=True)
    for part in map(Path, parts):
        for source in sorted(part.rglob("*")):
            if not source.is_file() or source.name == _SNAKEMAKE_STAMP:
                continue
            target = new / source.relative_to(part)
            if target.exists():
                raise CasebookError(source, None, f"{target.relative_to(new)} is made by "
                                    f"another part of the site too")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    shutil.rmtree(old, ignore_errors=True)
    if Path(site).exists():
        os.rename(site, old)
    os.rename(new, site)
    shutil.rmtree(old, ignore_errors=True)
