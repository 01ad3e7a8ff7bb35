"""The result tables of the pages, built with pandas from records.

Every cell is HTML-escaped; the only markup added is the link to a raw record or sample
file, whose address comes from ``href`` (a published path relative to the page). Rows
that failed carry the class ``fail`` on every cell, so a failure reads as one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
from pandas.io.formats.style import Styler

from casebook.core import fmt, paths
from casebook.measure.clocks import times_on_host
from casebook.report import conditions, evidence, history, status
from casebook.report.evidence import DOES_NOT_FIT, Evidence
from casebook.stages.timing import computed_outputs

Href = Callable[[str], str | None]  # a file under results/ -> its link, or None


def _cell(value: Any) -> Any:
    """A float to 6 significant digits; anything else as it is (an int stays an int)."""
    return f"{value:.6g}" if isinstance(value, float) else value


def _html(rows: list[dict[str, Any]], failed: list[bool], table_id: str) -> str:
    if not rows:
        return ""
    # object columns: a value missing from some rows must not turn 128 into 128.000000
    frame = pd.DataFrame(rows, dtype=object)
    classes = pd.DataFrame([["fail" if bad else ""] * frame.shape[1] for bad in failed],
                           columns=frame.columns)
    styler = (Styler(frame, uuid=table_id, cell_ids=False).hide(axis="index")
              .format(_cell, escape="html", na_rep="—").set_td_classes(classes))
    for column in ("record", "samples"):
        if column in frame:
            styler = styler.format(_link(column), subset=[column], escape="html", na_rep="—")
    html = styler.to_html(table_attributes='class="results"')
    return html.replace('<style type="text/css">\n</style>\n', "")


def _link(label: str) -> Callable[[str], str]:
    return lambda href: f'<a href="{href}">{"json" if label == "record" else "csv"}</a>'


def verification(ev: Evidence, href: Href) -> str:
    rows, failed = [], []
    for (variant, point), r in ev.verify.items():
        worst, ran = r["worst_error_over_tolerance"], r["ran"]
        rows.append({
            "variant": variant, "point": point,
            "result": ("passed" if r["passed"] else "FAILED") if ran
            else f"not run here: {r['not_run_reason']}",
            # A kernel that did not run has no draws, error or races to show.
            "draws": r["trials"] if ran else None,
            "max |error|": f"{r['max_abs_error']:.3g}" if ran else None,
            "worst error / tolerance": (f"{worst:.3g}" if worst is not None else "undefined")
            if ran else None,
            "races": ("yes" if r["races_found"] else "no") if ran else None,
            "seed": str(r["seed"]),
            "record": href(paths.verify_record(ev.target, ev.case, variant, point))})
        failed.append(r["ran"] and not r["passed"])
    return _html(rows, failed, f"verify-{ev.target}")


def _timing_row(what: str, role: str, point: str, record: dict[str, Any], path: str,
                href: Href) -> dict[str, Any]:
    m = record.get("measurement")
    execution = record.get("execution")
    return {
        "what": what, "role": role, "point": point,
        "interpret mode": ("yes" if execution["interpret"] else "no") if execution else None,
        "median": fmt.seconds(m["median_s"]) if m else
        f"not timed: {record['not_timed_reason']}",
        "interval": f"{fmt.seconds(m['ci_low_s'])} – {fmt.seconds(m['ci_high_s'])} "
                    f"({m['confidence']:.0%})" if m else None,
        "n": m["samples"] if m else None,
        "relative noise": f"{m['relative_noise']:.1%}" if m else None,
        "stopped by": f"{m['stop_criterion']}: {m['stop_reason']}" if m else None,
        "clock": m["clock_kind"] if m else None,
        "cache": m["cache"]["mode"] if m else None,
        "throttled (discarded)": m["throttling"]["discarded"] if m else None,
        "samples": href(paths.samples_table(path)),
        "record": href(path)}


def timing(ev: Evidence, href: Href) -> str:
    rows, failed = [], []
    for (variant, point), record in ev.time.items():
        path = paths.time_record(ev.target, ev.case, variant, point)
        rows.append(_timing_row(variant, "kernel", point, record, path, href))
        failed.append(not record["timed"])
    for (name, point), record in ev.baselines.items():
        path = paths.baseline_record(ev.target, ev.case, name, point)
        role = record["role"].replace("_", " ")
        rows.append(_timing_row(name, f"baseline: {role}", point, record, path, href))
        failed.append(not record["timed"])
    return _html(rows, failed, f"time-{ev.target}")


def _power_text(ev: Evidence, variant: str, point: str) -> str:
    power = ev.power(variant, point)
    if power is None:
        return "not measured"
    said = f"WEAK: {power['why']}" if power["weak"] else "every mutant caught"
    return said + (" (STALE: other sources)" if ev.power_stale(point) else "")


def untimed_baselines(ev: Evidence, variant: str, point: str) -> str | None:
    """Why ``variant`` at ``point`` has no verdict against baselines that compute its
    outputs (what a baseline computes read from its checks at any point): those not
    timed there, grouped by reason (XLA's own out-of-memory line left to the record);
    None when there are none."""
    computes = computed_outputs(ev.verify.get((variant, point), {}).get("checks", []))
    known = {name: computed_outputs([record["check"]]) for (name, _), record in ev.baselines.items()
             if "check" in record}
    why: dict[str, list[str]] = {}
    for (name, at), record in ev.baselines.items():
        if at == point and not record["timed"] and known.get(name) == computes:
            reason = record.get("not_timed_reason", "not timed")
            reason = DOES_NOT_FIT if reason.startswith(DOES_NOT_FIT) else reason  # XLA's line
            why.setdefault(reason, []).append(name)
    return "; ".join(f"not compared: {', '.join(names)}: {reason}" for reason, names in why.items()
                     ) or None


def summary(evs: list[Evidence], on_device: bool) -> str:
    """The case's results at a glance: one row per target, variant and point timed by a
    device clock (``on_device``) or on the host (an interpreter's times, no speed result):
    verified (worst error over tolerance), check power, median and interval, the paired
    verdict against each baseline (with the baseline's own fraction of the speed of light
    where it has one: a slow baseline reads as such), the fraction of the speed of light.
    A failed check or a WEAK one is marked, and so is a row whose records were made from
    other kernel sources, config or tile-table row than the current ones (STALE)."""
    rows, failed = [], []
    for ev in evs:
        verdicts: dict[tuple[str, str], list[str]] = {}
        for (variant, name, point), c in conditions.comparisons(ev).items():
            ratio = (f" {c.speedup:.2f}× [{c.low:.2f}, {c.high:.2f}]" if c.printable
                     else "")
            sol = status.baseline_sol(ev, name, point)
            own = "" if sol is None else f" (itself at {sol:.1%} of SOL)"
            verdicts.setdefault((variant, point), []).append(
                f"{c.verdict}{ratio} vs {name}{own}"
                + (" (STALE: compared before these records)" if ev.compare_stale(point)
                   else ""))
        for (variant, point), record in ev.time.items():
            if not record["timed"] or times_on_host(record["execution"]) == on_device:
                continue
            m, check = record["measurement"], ev.verify.get((variant, point), {})
            worst = check.get("worst_error_over_tolerance")
            sol = status.sol_fraction(record)
            power = _power_text(ev, variant, point)
            stale = (ev.stale_at(variant, point) or ev.power_stale(point)
                     or ((variant, point) in verdicts and ev.compare_stale(point)))
            rows.append({
                "target": ev.target + (" (STALE)" if stale else ""), "variant": variant,
                "point": point,
                "verified": ("passed" if check.get("passed") else "FAILED")
                + (f" ({worst:.2g} of tol.)" if worst is not None else ""),
                "check power": power,
                "median": fmt.seconds(m["median_s"]),
                "interval": f"{fmt.seconds(m['ci_low_s'])} – {fmt.seconds(m['ci_high_s'])}",
                "against baselines": "; ".join(verdicts.get((variant, point), []))
                or untimed_baselines(ev, variant, point),
                "of SOL": None if sol is None else f"{sol:.1%}"})
            failed.append(not check.get("passed") or power.startswith("WEAK") or stale)
    return _html(rows, failed, "summary-device" if on_device else "summary-host")


def _device_sol(evs: list[Evidence], variant: str, point: str) -> dict[str, str]:
    """``variant`` at ``point`` on each target that device-timed it with a fraction of the
    speed of light: target -> in words."""
    found = {}
    for ev in evs:
        record = ev.time.get((variant, point))
        sol = None if record is None else status.sol_fraction(record)
        if sol is not None:
            median = fmt.seconds(record["measurement"]["median_s"])
            found[ev.target] = f"{variant} on {ev.target}: {median}, {sol:.1%} of SOL"
    return found


def across_chips(evs: list[Evidence], spec: dict[str, Any]) -> dict[str, str] | None:
    """The reference and the port on their own chips (the case's ``across_chips``), by
    fraction of each chip's speed of light at every point both were device-timed at:
    ``table``, or ``none`` saying where each side was timed; None where the case sets no
    such pairs."""
    if not spec.get("across_chips"):
        return None
    points = [p["name"] for p in (*spec["points"], *spec.get("build_only_points", []))]
    rows, timed = [], {}
    for chips in spec["across_chips"]:
        variants = (chips["reference"], *chips["port"])
        found = {(v, point): _device_sol(evs, v, point) for v in variants for point in points}
        for (variant, point), said in found.items():  # the reference first
            for target in said:
                timed.setdefault(f"{variant} on {target}", []).append(point)
        for point in points:
            reference = list(found[chips["reference"], point].values())
            port = [text for v in chips["port"] for text in found[v, point].values()]
            if reference and port:
                rows.append({"point": point, "reference": "; ".join(reference),
                             "port": "; ".join(port)})
    if rows:
        return {"table": _html(rows, [False] * len(rows), "across-chips")}
    where = [f"{name} at {', '.join(at)}" for name, at in timed.items()]
    untimed = [v for chips in spec["across_chips"] for v in (chips["reference"], *chips["port"])
               if not any(name.startswith(f"{v} on ") for name in timed)]
    where += [f"{', '.join(untimed)} at none"] if untimed else []
    return {"none": "No problem has both the reference and the port device-timed with a "
                    f"fraction of the speed of light yet. Device-timed so: {'; '.join(where)}."}


def comparisons(ev: Evidence) -> str:
    rows = [{"kernel": variant, "baseline": name, "point": point,
             "verdict": c.verdict + (" (STALE)" if ev.compare_stale(point) else ""),
             "baseline / kernel": conditions.comparison_text(c)}
            for (variant, name, point), c in conditions.comparisons(ev).items()]
    rows += [{"kernel": variant, "baseline": name, "point": point, "verdict": "—",
              "baseline / kernel": why}
             for (variant, name, point), why in conditions.not_compared(ev).items()]
    return _html(rows, [False] * len(rows), f"compare-{ev.target}")


def across_commits(series: dict[str, list[dict[str, Any]]]) -> str:
    """Each figure's results across commits (``casebook.report.history.steps``), oldest first,
    each against the one before: a step (FASTER or SLOWER between two binaries) is marked,
    a SLOWER one and a miscalibrated floor as failures."""
    rows, failed = [], []
    for figure, kept in series.items():
        for item in kept:
            entry, change = item["entry"], item["change"]
            x = change.comparison if change else None
            rows.append({
                "figure": figure.split("/", 1)[1], "revision": item["revision"][:12],
                "measured": entry["measured_at"][:10],
                "median": fmt.seconds(entry["median_s"]),
                "interval": f"{fmt.seconds(entry['ci_low_s'])} – "
                            f"{fmt.seconds(entry['ci_high_s'])}",
                "binary": (entry["binary_sha256"] or "not named")[:12],
                "against the one before": f"{x.speedup:.3f}× [{x.low:.3f}, {x.high:.3f}] "
                                          f"{change.finding}" if x else "first",
                "step": ("STEP" if history.is_step(change) else "")
                        + (" (miscalibrated floor: the same binary)"
                           if change and change.finding == history.MISCALIBRATED
                           else "")})
            failed.append(change is not None and change.finding in (
                "SLOWER", history.MISCALIBRATED))
    return _html(rows, failed, "history")


def _run_here(ev: Evidence, launch: dict[str, Any]) -> str:
    if launch["build_only"]:
        return "no (build only)"
    record = ev.verify.get((launch["variant"], launch["point"]))
    if not record or not record["ran"]:
        return "no"
    interpreted = any(c.get("execution", {}).get("interpret") for c in record["checks"])
    return "yes (interpreter)" if interpreted else "yes"


def _dims(values: list[int] | None) -> str | None:
    return " × ".join(map(str, values)) if values else None


def lowering(ev: Evidence) -> str:
    """What each variant was compiled to at each point: launch shape, registers, shared
    and tensor memory, the tensor-core MMA, tiles and a persistent kernel's tile schedule,
    as far as its build records them (columns no build records are left out)."""
    rows = [{"variant": evidence.launch_name(r), "point": r["point"],
             "run here": _run_here(ev, r),
             "target": r["target"], "grid": _dims(r.get("grid")),
             "block": _dims(r.get("block")),
             "registers / thread": r.get("registers_per_thread"),
             "shared memory": f"{r['dynamic_smem_bytes']:,} B of {r['smem_limit_bytes']:,}",
             "tensor memory": (f"{r['tmem_columns']} of {r['tmem_limit_columns']} columns"
                               if "tmem_columns" in r else None),
             "tensor-core MMA": ", ".join(r.get("tcgen05_mma", [])) or None,
             "tiles": ", ".join(f"{k} {v}" for k, v in r.get("tuning", {}).items()) or None,
             "tile schedule": ", ".join(f"{k} {_dims(v) if isinstance(v, list) else v}"
                                        for k, v in r.get("tile_schedule", {}).items())
             or None,
             "partial blocks from": r.get("mask_source")}
            for r in evidence.lowered_launches(ev)]
    shown = [k for k in rows[0] if any(row[k] is not None for row in rows)] if rows else []
    rows = [{k: row[k] for k in shown} for row in rows]
    return _html(rows, [False] * len(rows), f"lowering-{ev.target}")


# Resources both kinds of build record per kernel, compared beside the SASS facts.
BINARY_FACTS = ("threads", "registers_per_thread", "stack_bytes", "local_bytes",
                "static_smem_bytes", "dynamic_smem_bytes", "stages")


def _binary_facts(build: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per point, the facts a build read from its binary: resources and ``sass``."""
    found = {}
    for point in (build or {}).get("points", []):
        for artifact in point.get("artifacts", []):
            facts = artifact["facts"]
            if "sass" in facts:
                found[point["point"]] = {**{k: facts[k] for k in BINARY_FACTS if k in facts},
                                         **facts["sass"]}
    return found


def _fact_text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,}" if isinstance(value, int) else str(value)


def side_by_side(ev: Evidence, spec: dict[str, Any]) -> str:
    """The case's port against the kernel it ports (``side_by_side`` in its config), fact
    by fact from the two binaries, rows with the same values merged across points. A
    difference the config does not explain, one it marks open, and an explanation of a
    fact that no longer differs are failures."""
    pair = spec.get("side_by_side")
    if not pair:
        return ""
    ours, theirs = (_binary_facts(ev.builds.get(pair[k])) for k in ("variant", "against"))
    both = [p for p in ours if p in theirs]
    explained = {d["fact"]: d for d in pair["differences"]}
    merged: dict[tuple[str, str, str], list[str]] = {}
    for point in both:
        for fact in dict.fromkeys([*ours[point], *theirs[point]]):
            values = tuple(_fact_text(side[point][fact]) if fact in side[point]
                           else "not recorded" for side in (ours, theirs))
            merged.setdefault((fact, *values), []).append(point)
    rows, failed, differing = [], [], set()
    for (fact, mine, other), points in merged.items():
        entry = explained.get(fact)
        if mine == other:
            verdict = "same"
        else:
            differing.add(fact)
            kind = entry and entry["kind"].replace("_", " ")
            verdict = (f"{kind.upper() if kind == 'open' else kind}: {entry['reason']}"
                       if entry else "UNEXPLAINED")
        rows.append({"fact": fact, pair["variant"]: mine, pair["against"]: other,
                     "points": f"all {len(both)}" if len(points) == len(both)
                     else ", ".join(points), "difference": verdict})
        failed.append(mine != other and (entry is None or entry["kind"] == "open"))
    for fact in sorted(explained.keys() - differing) if both else ():
        rows.append({"fact": fact, pair["variant"]: None, pair["against"]: None,
                     "points": None, "difference": "STALE: explained in the case config but "
                                                   "the same at every point"})
        failed.append(True)
    return _html(rows, failed, f"side-by-side-{ev.target}")


def bit_exact(record: dict[str, Any] | None, href: Href, path: str) -> str:
    """A port against the kernel it ports, bit for bit, per point (``casebook.stages.bit_exact``);
    a host that could not run them says why. A point whose outputs differ is a failure."""
    if record is None:
        return ""
    pair = f"{record['variant']} against {record['against']}"
    if not record["ran"]:
        return _html([{"compared": pair, "result": f"not run here: {record['not_run_reason']}",
                       "record": href(path)}], [False], f"bit-exact-{record['target']}")
    rows = [{"compared": pair, "point": p["point"], "elements": p["elements"],
             "differing": p["differing"],
             "first differing (row, column)": _dims(p["first_differing"]),
             "result": "identical bits" if p["differing"] == 0 else "DIFFERENT BITS",
             "seed": record["seed"], "record": href(path)} for p in record["points"]]
    return _html(rows, [p["differing"] > 0 for p in record["points"]],
                 f"bit-exact-{record['target']}")


def _row_label(tiles: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in tiles.items())


def _hand(record: dict[str, Any]) -> str:
    agrees = record["pick_is_hand"]
    return "yes: " + ("nothing picked" if agrees is None else
                      "the loop agrees" if agrees else "the loop picked other tiles")


def tile_choices(ev: Evidence, href: Href) -> str:
    """Each autotuned point's candidates with their evidence: shared memory, verdict
    against the oracle, median and interval; the picked row says why, and the hand
    choice's row whether the loop agreed with it."""
    rows, failed = [], []
    for (variant, point), record in ev.tile_choices.items():
        path = paths.tile_choice_record(ev.target, ev.case, variant, point)
        picked = record["pick"] and record["pick"]["tiles"]
        for c in record["candidates"]:
            m, check = c.get("measurement"), c["verify"]
            worst = check.get("worst_error_over_tolerance")
            rows.append({
                "variant": variant, "point": point, record["key"]: _row_label(c["tiles"]),
                "shared memory": ", ".join(f"{k} {b:,} B" for k, b in c["smem_bytes"].items())
                or "— (a TPU kernel's VMEM, checked by Mosaic)",
                "verified": ("passed" if check["passed"] else "FAILED")
                + (f" ({worst:.3g} of tolerance)" if worst is not None else "")
                + (f": {check['error']}" if check.get("error") else ""),
                "median": fmt.seconds(m["median_s"]) if m else
                f"not timed: {c['not_timed_reason']}",
                "interval": f"{fmt.seconds(m['ci_low_s'])} – {fmt.seconds(m['ci_high_s'])} "
                            f"({m['confidence']:.0%})" if m else None,
                "interpret mode": "yes" if c.get("execution", {}).get("interpret") else "no",
                "pick": f"PICKED: {record['reason']}" if c["tiles"] == picked else "",
                "hand choice": _hand(record) if c["tiles"] == record["hand"] else "",
                "record": href(path)})
            failed.append(not check["passed"])
    return _html(rows, failed, f"tiles-{ev.target}")


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in params.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = ", ".join(map(str, value)) if isinstance(
                value, list) else value
    return flat


def points(spec: dict[str, Any]) -> str:
    """The problem grid of a case config, one row per point."""
    rows = [{"point": p["name"], **_flatten(p["params"])} for p in spec["points"]]
    return _html(rows, [False] * len(rows), f"points-{spec['name']}")


def frame(rows: list[dict[str, Any]], table_id: str) -> str:
    """Any list of plain facts as an escaped table (used by the methods page)."""
    return _html(rows, [False] * len(rows), table_id)
