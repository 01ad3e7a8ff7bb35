"""The figures stage: SVGs drawn from records, each with a six-condition sidecar.

A figure is refused (the stage fails, naming the file and field) when a record fails its
schema or a condition cannot be assembled; a timing figure is withheld when no point of
the case passed verification, and the manifest says why.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from casebook.core import cases, config, paths, records
from casebook.report import conditions, scaling
from casebook.report.drawing import (
    MIN_FONT_PT,
    WIDTH_IN,
    face_label,
    outputs_of,
    plain_log_ticks,
    plt,
    save,
    time_unit,
)
from casebook.report.evidence import DOES_NOT_FIT, Evidence, gather, launch_name, lowered_launches


def draw_correctness(ev: Evidence) -> plt.Figure:
    """One horizontal bar per variant and point (labels never crowd an axis). A log axis
    draws no bar for a zero error: such a row says "0: bit-exact" in words instead, and a
    row without a ratio (an exact-only tolerance) says so."""
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.24 * len(ev.ran) + 1.3), layout="constrained")
    labels, values, colours = [], [], []
    for (variant, point), record in ev.ran.items():
        worst = record["worst_error_over_tolerance"]
        labels.append(f"{variant} @ {point}")
        values.append(worst if worst is not None else float("nan"))
        colours.append("#2a7f62" if record["passed"] else "#c0392b")
    ax.barh(labels, [v if v > 0 else float("nan") for v in values], color=colours)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="tolerance")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    drawn = [v for v in values if v > 0]
    low = min([*drawn, 1.0]) / 10
    ax.set_xlim(left=low, right=max([*drawn, 1.0]) * 3)
    for row, (value, colour) in enumerate(zip(values, colours, strict=True)):
        if not value > 0:
            ax.text(low * 1.2, row, "0: bit-exact" if value == 0 else "no ratio (exact only)",
                    va="center", fontsize=MIN_FONT_PT, color=colour)
    ax.set_xlabel("worst |error| / tolerance")
    ax.legend(loc="lower right", fontsize=MIN_FONT_PT)
    ax.set_title(f"Worst error against tolerance\n{face_label(ev, list(ev.ran.values()))}")
    return fig


def correctness_figure(ev: Evidence, path: str) -> dict[str, Any]:
    save(draw_correctness(ev), path)
    return {"title": "Worst error against tolerance",
            "caption": "Largest elementwise error over all random draws, divided by the "
                       "stated tolerance (below 1 passes); red bars failed."}


REGISTER_LIMIT = 255  # registers per thread an sm_90 kernel may use


def build_figure(ev: Evidence, path: str) -> dict[str, Any]:
    """Shared memory per configuration; beside it registers per thread, where the builds
    record them (read from the cubin)."""
    launches = lowered_launches(ev)
    registers = all("registers_per_thread" in r for r in launches)
    # Points whose builds record the same resources share one bar (one compiled kernel).
    same: dict[tuple, list[dict[str, Any]]] = {}
    for r in launches:
        key = (launch_name(r), r["target"], r["dynamic_smem_bytes"],
               r.get("registers_per_thread"))
        same.setdefault(key, []).append(r)
    rows = [group[0] for group in same.values()]
    labels = [f"{launch_name(g[0])} @ {g[0]['point']}" if len(g) == 1 else
              f"{launch_name(g[0])} @ {len(g)} points ({g[0]['point']}, …)"
              for g in same.values()]
    fig, axes = plt.subplots(1, 2 if registers else 1, squeeze=False, sharey=True,
                             figsize=(WIDTH_IN, 0.19 * len(rows) + 1.4),
                             layout="constrained")
    panels = [("dynamic shared memory per CTA (KiB)", [r["dynamic_smem_bytes"] / 1024
                                                       for r in rows],
               rows[0]["smem_limit_bytes"] / 1024, "KiB per block")]
    if registers:
        panels.append(("registers per thread", [r["registers_per_thread"] for r in rows],
                       REGISTER_LIMIT, "per thread"))
    for ax, (label, values, limit, unit) in zip(axes[0], panels, strict=True):
        ax.barh(labels, values, color=["#2a7f62" if v <= limit else "#c0392b" for v in values])
        ax.axvline(limit, color="black", linestyle="--", linewidth=1,
                   label=f"limit {limit:.0f} {unit}")
        ax.set_xlabel(label)
        ax.legend(loc="lower right", fontsize=MIN_FONT_PT)
    axes[0][0].invert_yaxis()
    targets = ", ".join(sorted({r["target"] for r in rows}))
    title = "Shared memory and registers" if registers else "Shared memory"
    fig.suptitle(f"{title} per configuration\nlowered for {targets} on "
                 f"{ev.target.upper()} · compiled, not run")
    save(fig, path)
    return {"title": f"{title} per configuration",
            "caption": "Dynamic shared memory of every compiled configuration, as its build "
                       "records it (the gpu.launch operand of a Mosaic GPU module; the "
                       "shared-storage size of a CuTe DSL or CUTLASS kernel), against the "
                       "per-block limit"
                       + ("; registers per thread from cuobjdump -res-usage of the cubin"
                          if registers else "")
                       + ". Points with identical resources share a bar; configurations "
                         "marked build-only are compiled here and run only on a GPU host."}


def draw_timing(ev: Evidence, points: list[str]) -> plt.Figure:
    """Median time per call with its interval, one panel per set of outputs computed
    (a backward is not set beside forward baselines), in µs or ms as the times are."""
    groups: dict[frozenset[str], dict[str, dict[str, dict[str, Any]]]] = {}
    named: dict[frozenset[str], tuple[str, ...]] = {}  # each set in its first record's order

    def add(outputs: tuple[str, ...], label: str, point: str, measured: dict) -> None:
        named.setdefault(frozenset(outputs), outputs)
        groups.setdefault(frozenset(outputs), {}).setdefault(label, {})[point] = measured

    for (variant, point), record in ev.time.items():
        if point in points and record["timed"]:
            add(outputs_of(ev.verify.get((variant, point), {})), variant, point,
                record["measurement"])
    for (name, point), record in ev.baselines.items():
        if point in points and record["timed"]:
            add(outputs_of(record), f"baseline: {name}", point, record["measurement"])
    groups = groups or {frozenset(): {}}
    # What was not timed says why where the bar would be: a baseline too big for the
    # device's memory is a result, not a gap.
    # (Each in the panel where the same kernel or baseline is timed elsewhere, else the first.)
    home = {label: key for key, series in groups.items() for label in series}
    first = min(groups, key=sorted)
    untimed: dict[tuple[frozenset[str], int], list[str]] = {}
    for (label, point), record in (*ev.time.items(), *(
            ((f"baseline: {n}", p), r) for (n, p), r in ev.baselines.items())):
        if point in points and not record["timed"] and record.get(
                "not_timed_reason", "").startswith(DOES_NOT_FIT):
            untimed.setdefault((home.get(label, first), points.index(point)), []).append(
                f"{label.removeprefix('baseline: ')}: does not fit in memory")
    unit, scale = time_unit([m["median_s"] for series in groups.values()
                             for by_point in series.values() for m in by_point.values()])
    # One panel under another: each as wide as the figure, so its labels stay readable.
    fig, axes = plt.subplots(len(groups), 1, figsize=(WIDTH_IN, 3.2 * len(groups) + 0.6),
                             squeeze=False, layout="constrained")
    for ax, (key, series) in zip(axes[:, 0], sorted(groups.items(),
                                                    key=lambda g: sorted(g[0])), strict=True):
        outputs = named.get(key, ())
        width = 0.8 / max(len(series), 1)
        for i, (label, by_point) in enumerate(series.items()):
            xs = [points.index(p) + (i - (len(series) - 1) / 2) * width for p in by_point]
            ms = list(by_point.values())
            errors = [[(m["median_s"] - m["ci_low_s"]) * scale for m in ms],
                      [(m["ci_high_s"] - m["median_s"]) * scale for m in ms]]
            ax.bar(xs, [m["median_s"] * scale for m in ms], width, yerr=errors, capsize=2,
                   label=label)
        ax.set_xticks(range(len(points)), points, fontsize=MIN_FONT_PT if len(points) > 3 else None,
                      rotation=20 if len(points) > 3 else 0,
                      ha="right" if len(points) > 3 else "center")
        ax.set_xlim(-0.6, len(points) - 0.4)  # a point with no bar keeps its slot
        shown = {points.index(p) for by_point in series.values() for p in by_point}
        for index in range(len(points)):
            said = untimed.get((key, index), [])
            if said or index not in shown:
                ax.text(index, 0.03, "\n".join(said or ["no time record"]), ha="center",
                        va="bottom", rotation=90, fontsize=MIN_FONT_PT, color="0.35",
                        transform=ax.get_xaxis_transform())
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
        lows = [m["ci_low_s"] * scale for by_point in series.values()
                for m in by_point.values()]
        if lows:  # bars start a decade-third below the fastest: heights compare
            ax.set_ylim(bottom=min(lows) / 3)
        ax.set_ylabel(f"median time per call ({unit}), 95% CI")
        ax.set_title(f"computing {', '.join(outputs)}" if outputs else "", fontsize=9)
        if series:
            ax.legend(fontsize=MIN_FONT_PT)
    floor = (f"A/A noise floor ±{ev.noise_floor['noise_floor']:.1%} apart, "
             f"±{ev.noise_floor['paired']['noise_floor']:.1%} interleaved" if ev.noise_floor
             else "no noise floor recorded")
    made = [r for (_, p), r in (*ev.time.items(), *ev.baselines.items())
            if p in points and r["timed"]]
    fig.suptitle(f"Time per call, kernel and baselines\n{face_label(ev, made)} · {floor}")
    return fig


def timing_figure(ev: Evidence, path: str, points: list[str]) -> dict[str, Any]:
    save(draw_timing(ev, points), path)
    said = {key: conditions.comparison_text(c) for key, c in conditions.comparisons(ev).items()}
    said.update(conditions.not_compared(ev))
    verdicts = "; ".join(f"{variant} against {name} @ {point}: {text}"
                         for (variant, name, point), text in said.items())
    return {"title": "Time per call, kernel and baselines",
            "caption": "Median of the samples with its distribution-free confidence "
                       "interval; only points that passed verification are shown. "
                       + (f"Comparisons: {verdicts}." if verdicts else "")}


def _launches(ev: Evidence, variant: str, point: str) -> int:
    """Kernel launches the variant's build at ``point`` compiled."""
    entries = ev.builds.get(variant, {}).get("points", [])
    return sum(len(e.get("artifacts", [])) for e in entries if e["point"] == point)


def contrast_figure(ev: Evidence, contrast: dict[str, Any], points: list[str],
                    moved: dict[str, dict[str, list[dict[str, Any]]]], path: str
                    ) -> dict[str, Any]:
    """Two variants that compute the same result, side by side at each point where both
    were timed: median and interval, with the launches each built and the intermediate
    tensors each hands between its kernels through memory (``moved``: variant -> point ->
    [{tensor, bytes}]). Timed in separate jobs: not a paired comparison."""
    pair = (contrast["variant"], contrast["against"])
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.4), layout="constrained")
    for i, variant in enumerate(pair):
        ms = [ev.time[(variant, p)]["measurement"] for p in points]
        xs = [j + (i - 0.5) * 0.4 for j in range(len(points))]
        ax.bar(xs, [m["median_s"] * 1e3 for m in ms], 0.4, label=variant,
               yerr=[[(m["median_s"] - m["ci_low_s"]) * 1e3 for m in ms],
                     [(m["ci_high_s"] - m["median_s"]) * 1e3 for m in ms]], capsize=2)
    ax.set_xticks(range(len(points)), points)
    ax.set_ylabel("median time per call (ms), 95% CI")
    ax.legend(fontsize=MIN_FONT_PT)
    made = [ev.time[(v, p)] for v in pair for p in points]
    ax.set_title(f"{contrast['title']}\n{face_label(ev, made)}")
    save(fig, path)
    facts = []
    for p in points:
        ratio = (ev.time[(pair[1], p)]["measurement"]["median_s"]
                 / ev.time[(pair[0], p)]["measurement"]["median_s"])
        said = []
        for variant in pair:
            tensors = moved.get(variant, {}).get(p, [])
            traffic = 2 * sum(t["bytes"] for t in tensors)  # written once, read once
            said.append(f"{variant}: {_launches(ev, variant, p)} launches, "
                        + (", ".join(f"{t['tensor']} {t['bytes']:,} B" for t in tensors)
                           or "no intermediate tensor")
                        + f" ({traffic:,} B of memory traffic)")
        facts.append(f"{p}: " + "; ".join(said) + f"; median {pair[1]} / {pair[0]} = "
                     f"{ratio:.3g}.")
    return {"title": contrast["title"],
            "caption": "Median time per call of each, with its distribution-free confidence "
                       "interval, at the points where both passed verification and were "
                       "timed; timed in separate jobs, so the ratio of medians is not a "
                       "paired comparison. Intermediate tensors at capacity (all M rows). "
                       + " ".join(facts)}


def _contrast_plans(ev: Evidence, spec: dict[str, Any]) -> tuple[list, list]:
    """Each of the case's ``contrasts`` to draw, or to withhold with why."""
    plans, withheld = [], []
    if not spec.get("contrasts"):
        return plans, withheld
    hook = getattr(cases.load(spec["name"]), "intermediates", None)
    params = {p["name"]: p["params"] for p in paths.for_target(spec, ev.target)["points"]}
    for contrast in spec["contrasts"]:
        pair = (contrast["variant"], contrast["against"])
        points = [p for p in ev.points
                  if all(ev.time.get((v, p), {}).get("timed") for v in pair)]
        name = f"contrast_{contrast['name']}"
        if not points:
            withheld.append({"figure": name, "reason": f"{pair[0]} and {pair[1]} were not "
                             "both timed at any point on this target"})
            continue
        moved = {v: {p: hook(v, params[p]) if hook else [] for p in points} for v in pair}
        plans.append((name, lambda path, c=contrast, pts=points, mv=moved:
                      contrast_figure(ev, c, pts, mv, path)))
    return plans, withheld


def _resources(artifacts: list[dict[str, Any]]) -> str:
    """A build's launches in brief: shared memory, block and grid of each."""
    found = [a["facts"] for a in artifacts if "dynamic_smem_bytes" in a["facts"]]
    return " + ".join(f"{f['dynamic_smem_bytes']:,} B smem, block {f['block'][0]}, grid "
                      f"{'x'.join(map(str, f['grid']))}" for f in found) or "no launch"


def _ablation_fact(record: dict[str, Any], kernel_median: float) -> str:
    """What one ablation record says at its point, in one phrase."""
    name = record["ablation"]
    if not record["applies"]:
        return f"{name}: does not apply ({record['not_applied_reason']})"
    built = _resources(record["built"].get("artifacts", []))
    if not record["timed"]:
        return f"{name}: {built}; not timed ({record['not_timed_reason']})"
    drawn = record["against_oracle"]
    worst = drawn["worst_error_over_tolerance"]
    result = ("the oracle's result within tolerance" if drawn["within_tolerance"] else
              f"a wrong result ({worst:.3g}× the tolerance)" if worst is not None else
              f"a wrong result ({drawn['nan_count']} non-finite outputs)"
              if drawn["nan_count"] else "a wrong result (outside the tolerance)")
    ratio = record["measurement"]["median_s"] / kernel_median
    return f"{name}: {ratio:.3g}× the kernel's median; {built}; computes {result}"


def ablation_figure(ev: Evidence, variant: str, points: list[str], path: str
                    ) -> dict[str, Any]:
    """Where the time goes: the verified variant's time beside each of its ablations' (a
    part switched off) at every point where the variant was timed, with each one's
    launches as lowered and how far its result lies from the oracle."""
    names = [a["name"] for a in ev.spec["ablations"] if a["of"] == variant]
    series = [(f"{variant} (verified)", {p: ev.time[(variant, p)] for p in points})]
    series += [(name, {p: r for p in points
                       if (r := ev.ablations.get((name, p), {})).get("timed")})
               for name in names]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.6), layout="constrained")
    width = 0.8 / len(series)
    for i, (label, by_point) in enumerate(series):
        ms = [r["measurement"] for r in by_point.values()]
        xs = [points.index(p) + (i - (len(series) - 1) / 2) * width for p in by_point]
        ax.bar(xs, [m["median_s"] * 1e3 for m in ms], width, label=label,
               yerr=[[(m["median_s"] - m["ci_low_s"]) * 1e3 for m in ms],
                     [(m["ci_high_s"] - m["median_s"]) * 1e3 for m in ms]], capsize=2)
    ax.set_xticks(range(len(points)), points)
    ax.set_ylabel("median time per call (ms), 95% CI")
    ax.legend(fontsize=MIN_FONT_PT)
    made = [r for _, by_point in series for r in by_point.values()]
    ax.set_title(f"Where the time goes: {variant}, one part off at a time\n"
                 f"{face_label(ev, made)}")
    save(fig, path)
    switched = "; ".join(f"{a['name']} switches off {a['switches_off']}"
                         for a in ev.spec["ablations"] if a["of"] == variant)
    facts = []
    for p in points:
        kernel = ev.time[(variant, p)]
        built = next((e.get("artifacts", []) for e in ev.builds.get(variant, {}).get(
            "points", []) if e["point"] == p), [])
        facts.append(f"{p}: {variant}: {_resources(built)}; " + "; ".join(
            _ablation_fact(ev.ablations[(n, p)], kernel["measurement"]["median_s"])
            for n in names if (n, p) in ev.ablations) + ".")
    return {"title": f"Where the time goes: {variant}",
            "caption": f"Median time per call of the verified {variant} and of each of its "
                       "ablations (the same kernel with one part switched off), with "
                       "distribution-free confidence intervals, at the points where the "
                       "kernel passed verification; each timed in its own job, so ratios of "
                       "medians are not paired comparisons. An ablation is never verified: "
                       "it computes a wrong result on purpose, and its distance from the "
                       f"oracle on one fresh draw is stated, not judged. {switched}. "
                       + " ".join(facts)}


def _ablation_plans(ev: Evidence) -> tuple[list, list]:
    """A "where the time goes" figure per ablated variant, or why it is withheld."""
    plans, withheld = [], []
    for variant in dict.fromkeys(a["of"] for a in ev.spec["ablations"]):
        names = [a["name"] for a in ev.spec["ablations"] if a["of"] == variant]
        points = [p for p in ev.points if ev.time.get((variant, p), {}).get("timed")
                  and any(ev.ablations.get((n, p), {}).get("timed") for n in names)]
        name = f"ablation_{variant}"
        if not points:
            withheld.append({"figure": name, "reason": f"{variant} and an ablation of it "
                             "were not both timed at any point on this target"})
            continue
        plans.append((name, lambda path, v=variant, pts=points:
                      ablation_figure(ev, v, pts, path)))
    return plans, withheld


def run(case_dir: str, case: str, target: str, measured: Collection[str]) -> dict[str, Any]:
    """The figures of ``case`` on ``target``; records of ``measured`` targets must all exist."""
    spec = config.load_case(case_dir, case)
    ev = gather(spec, target, must_exist=target in measured)
    six = conditions.assemble(ev)
    drawn, withheld = [], []
    verified_points = [p for p in ev.points
                       if any(ev.verify.get((v, p), {}).get("passed") for v in ev.variants)]
    plans = []
    nothing_ran = ("; ".join(f"{v} not run here: {why}" for v, why in ev.not_run.items())
                   or "no verification records on this target")
    if ev.ran:
        plans.append(("correctness", lambda path: correctness_figure(ev, path)))
    else:
        withheld.append({"figure": "correctness", "reason": nothing_ran})
    if lowered_launches(ev):
        plans.append(("build", lambda path: build_figure(ev, path)))
    if verified_points:
        plans.append(("timing", lambda path: timing_figure(ev, path, verified_points)))
        more, held = scaling.plans(ev, verified_points)
        plans += more
        withheld += held
    else:
        withheld.append({"figure": "timing", "reason": (
            "no point passed verification on this target: nothing is timed or published"
            if ev.ran else nothing_ran)})
    for more, held in (_contrast_plans(ev, spec), _ablation_plans(ev)):
        plans += more
        withheld += held
    for name, draw in plans:
        svg = paths.figure(case, target, name)
        meta = draw(svg)
        records.write(paths.sidecar(svg), "figure", {
            "case": case, "target": target, "figure": name, **meta,
            "svg": Path(svg).name, "conditions": six, "sources": ev.sources})
        drawn.append(name)
    return records.write(paths.figure_manifest(case, target), "manifest", {
        "case": case, "target": target, "figures": drawn, "withheld": withheld,
        "verified": ev.verified, "stale": ev.stale})
