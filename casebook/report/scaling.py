"""The scaling figure: median time per call against problem size, one line per kernel
variant and baseline, with the speed-of-light bound beside them.

A series is a set of the target's points whose params differ only in one integer (a size:
``seq_len`` 4096 ... 32768 of splash attention, causal, head dim 128); ``series`` finds
every one in a case's grid, so a case whose points differ in more than one param at a
time gets no scaling figure. One row of panels per series, one panel per set of outputs
computed (as the timing figure: a backward is not set beside forward baselines). What
ran out of the device's memory is marked, never drawn as a time; each point of a tuned
variant says which tiles it ran, read from its record.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from matplotlib import lines as mlines

from casebook.core.fmt import seconds
from casebook.report import status
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
from casebook.report.evidence import DOES_NOT_FIT, Evidence

MIN_SIZES = 3  # a series' sizes: two make a ratio (the timing figure shows it), not a trend
MIN_POINTS = 2  # a line's timed sizes
MARKERS = "os^Dv"  # a line drawn over another (equal times) still shows its marks
TILE_ROW = 0.11  # the share of a panel's height one line's row of tile labels takes


@dataclasses.dataclass(frozen=True)
class Series:
    param: str  # the size that varies
    points: tuple[str, ...]  # ordered by size
    sizes: tuple[int, ...]
    fixed: str  # the params it shares that vary elsewhere in the grid, in words


def _words(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(_words(v) for v in value.values())
    return str(value)


def series(points: list[dict[str, Any]]) -> list[Series]:
    """Every largest set of ``points`` (``{name, params}``) whose params differ only in one
    integer, at ``MIN_SIZES`` sizes or more."""
    found: dict[tuple[str, str], dict[int, str]] = {}
    for point in points:
        for key, value in point["params"].items():
            if isinstance(value, int) and not isinstance(value, bool):
                rest = json.dumps({k: v for k, v in point["params"].items() if k != key},
                                  sort_keys=True)
                found.setdefault((key, rest), {}).setdefault(value, point["name"])
    keys = {k for p in points for k in p["params"]}
    varying = [k for k in keys if len({json.dumps(p["params"].get(k), sort_keys=True)
                                       for p in points}) > 1]
    out = []
    for (key, rest), by_size in found.items():
        if len(by_size) >= MIN_SIZES:
            shared = json.loads(rest)
            sizes = tuple(sorted(by_size))
            out.append(Series(key, tuple(by_size[s] for s in sizes), sizes, " · ".join(
                f"{k} {_words(shared[k])}" for k in sorted(varying) if k in shared)))
    return sorted(out, key=lambda s: (s.param, s.fixed))


def tiles_used(ev: Evidence, variant: str, point: str, record: dict[str, Any]) -> str | None:
    """The tiles a time record ran at, from the records: its tile table's row where it
    applied one, the config's row where the point gives its own, else (a record made
    without a table) the case's own choice as the autotune recorded it; None where the
    variant's tiles are not tuned on this target."""
    used = record.get("tile_table")
    if used and used["applied"]:
        return f"{_tiles(used['tuned'])}, tuned"
    if used:
        return f"{_tiles(record['params'][used['key']])}, the config's"
    choice = ev.tile_choices.get((variant, point))
    return f"{_tiles(choice['hand'])}, untuned" if choice else None


def _tiles(row: dict[str, Any]) -> str:
    return " ".join(f"{k} {v}" for k, v in row.items())


@dataclasses.dataclass
class Panel:
    outputs: tuple[str, ...]
    lines: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    tiles: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    no_fit: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def bounds(self) -> dict[str, float]:
        """Point -> the lowest speed-of-light bound its device-timed records carry."""
        found: dict[str, float] = {}
        for by_point in self.lines.values():
            for point, record in by_point.items():
                if status.sol_fraction(record) is not None:
                    bound = record["speed_of_light"]["bound_s"]
                    found[point] = min(found.get(point, bound), bound)
        return found


def panels(ev: Evidence, points: tuple[str, ...]) -> list[Panel]:
    """The panels of one series' ``points`` with a line of two sizes or more: each set of
    outputs with its timed lines, the tiles each tuned point ran, and what did not fit in
    the device's memory (in the panel where the same kernel or baseline is timed, else the
    first)."""
    found: dict[frozenset[str], Panel] = {}
    entries = [(v, p, r, outputs_of(ev.verify.get((v, p), {})), v)
               for (v, p), r in ev.time.items()]
    entries += [(f"baseline: {b}", p, r, outputs_of(r), None)
                for (b, p), r in ev.baselines.items()]
    rank = {label: i for i, label in reversed(list(enumerate(e[0] for e in entries)))}
    entries = sorted((e for e in entries if e[1] in points),
                     key=lambda e: (rank[e[0]], points.index(e[1])))  # the config's order
    for label, point, record, outputs, variant in entries:
        if record["timed"]:
            panel = found.setdefault(frozenset(outputs), Panel(outputs))
            panel.lines.setdefault(label, {})[point] = record
            if variant and (tiles := tiles_used(ev, variant, point, record)):
                panel.tiles[label, point] = tiles
    drawn = [p for p in found.values() if any(len(b) >= MIN_POINTS for b in p.lines.values())]
    for label, point, record, _, _ in entries:
        if drawn and not record["timed"] and record.get(
                "not_timed_reason", "").startswith(DOES_NOT_FIT):
            home = next((p for p in drawn if label in p.lines), drawn[0])
            home.no_fit.setdefault(label, []).append(point)
    return drawn


def draw(ev: Evidence, rows: list[tuple[Series, list[Panel]]]) -> plt.Figure:
    """A panel per series and set of outputs, one under another: log-2 size across, log
    time up, median and interval per timed point, the speed-of-light bound dashed, what
    does not fit marked at the top."""
    stacked = [(line, panel) for line, row_panels in rows for panel in row_panels]
    fig, axes = plt.subplots(len(stacked), 1, squeeze=False, layout="constrained",
                             figsize=(WIDTH_IN, 3.0 * len(stacked) + 0.9))
    labels = sorted(dict.fromkeys(label for _, row_panels in rows for panel in row_panels
                                  for label in (*panel.lines, *panel.no_fit)),
                    key=lambda label: label.startswith("baseline: "))  # kernels first
    colour = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    marker = {label: MARKERS[i % len(MARKERS)] for i, label in enumerate(labels)}
    made = []
    for (line, panel), ax in zip(stacked, axes[:, 0], strict=True):
        made += [r for by_point in panel.lines.values() for r in by_point.values()]
        _draw_panel(ax, line, panel, colour, marker)
    handles = [mlines.Line2D([], [], color=colour[label], marker=marker[label], label=label)
               for label in labels if any(label in p.lines for _, ps in rows for p in ps)]
    if any(p.bounds() for _, ps in rows for p in ps):
        handles.append(mlines.Line2D([], [], color="black", linestyle="--",
                                     label="speed of light (the records' bound)"))
    if any(p.no_fit for _, ps in rows for p in ps):
        handles.append(mlines.Line2D([], [], color="0.3", marker="x", linestyle="none",
                                     label="does not fit in the device's memory (× in its "
                                           "line's colour)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 2),
               fontsize=MIN_FONT_PT, frameon=False)
    param = ", ".join(dict.fromkeys(line.param for line, _ in rows))
    fig.suptitle(f"Time per call against {param}\n{face_label(ev, made)}", fontsize=9)
    return fig


def _draw_panel(ax, line: Series, panel: Panel, colour: dict[str, str],
                marker: dict[str, str]) -> None:
    size = dict(zip(line.points, line.sizes, strict=True))
    times = [r["measurement"] for by_point in panel.lines.values() for r in by_point.values()]
    bounds = panel.bounds()
    unit, scale = time_unit([m["median_s"] for m in times])
    for label, by_point in panel.lines.items():
        ms = [r["measurement"] for r in by_point.values()]
        xs = [size[p] for p in by_point]
        ax.errorbar(xs, [m["median_s"] * scale for m in ms], color=colour[label],
                    marker=marker[label], markersize=4, capsize=2, linewidth=1.2,
                    yerr=[[(m["median_s"] - m["ci_low_s"]) * scale for m in ms],
                          [(m["ci_high_s"] - m["median_s"]) * scale for m in ms]])
    if bounds:
        ax.plot([size[p] for p in line.points if p in bounds],
                [bounds[p] * scale for p in line.points if p in bounds],
                color="black", linestyle="--", linewidth=1)
    for row, (label, points) in enumerate(panel.no_fit.items()):
        ax.plot([size[p] for p in points], [0.95 - 0.06 * row] * len(points), "x",
                color=colour[label], transform=ax.get_xaxis_transform(), markersize=6,
                clip_on=False)
    tiled = list(dict.fromkeys(label for label, _ in panel.tiles))
    for row, label in enumerate(tiled):  # a strip under the data: never over a line
        for point in panel.lines[label]:
            if tiles := panel.tiles.get((label, point)):
                ax.text(size[point], TILE_ROW * (row + 0.3), tiles.replace(", ", "\n"),
                        transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                        fontsize=MIN_FONT_PT, color=colour[label])
    ax.set_yscale("log")
    low = min([m["ci_low_s"] for m in times] + list(bounds.values())) * scale
    high = max(m["ci_high_s"] for m in times) * scale * 4  # room for the top's × marks
    # The data fills the axes above the tiles' strip (log space: the strip's share of it).
    strip = TILE_ROW * (len(tiled) + 0.3)
    ax.set_ylim(low / (high / low) ** (strip / (1 - strip)) / 2, high)
    plain_log_ticks(ax.yaxis)
    ax.set_xscale("log", base=2)
    ax.set_xticks(line.sizes, [str(s) for s in line.sizes], fontsize=MIN_FONT_PT)
    ax.set_xticks([], minor=True)
    ax.set_xlim(line.sizes[0] / 1.3, line.sizes[-1] * 1.3)
    ax.set_xlabel(f"{line.param} (log 2)")
    ax.set_ylabel(f"median time per call ({unit}), 95% CI")
    ax.set_title(f"{line.fixed}\ncomputing {', '.join(panel.outputs)}", fontsize=8)


def _fact(label: str, point: str, record: dict[str, Any], panel: Panel, size: int) -> str:
    """One drawn point in words: size, median, fraction of the bound, tiles."""
    median = record["measurement"]["median_s"]
    bound = panel.bounds().get(point) if status.sol_fraction(record) is not None else None
    notes = [f"{bound / median:.1%} of the speed of light"] if bound else []
    notes += [panel.tiles[label, point]] if (label, point) in panel.tiles else []
    return f"{size} {seconds(median)}" + (f" ({'; '.join(notes)})" if notes else "")


def figure(ev: Evidence, rows: list[tuple[Series, list[Panel]]], path: str
           ) -> dict[str, Any]:
    """Draw ``rows`` to ``path``; the sidecar's title and caption, with every number drawn."""
    save(draw(ev, rows), path)
    facts = []
    for line, row_panels in rows:
        size = dict(zip(line.points, line.sizes, strict=True))
        for panel in row_panels:
            said = [f"{label}: " + ", ".join(_fact(label, p, r, panel, size[p])
                                             for p, r in by_point.items())
                    for label, by_point in panel.lines.items()]
            said += [f"{label} passed verification at {', '.join(map(str, unt))} but has no "
                     "time record there" for label in panel.lines
                     if (unt := [size[p] for p in line.points if p not in panel.lines[label]
                                 and ev.verify.get((label, p), {}).get("passed")])]
            said += [f"{label} does not fit in the device's memory at "
                     + ", ".join(str(size[p]) for p in points)
                     for label, points in panel.no_fit.items()]
            if bounds := panel.bounds():
                said.append("speed of light " + ", ".join(
                    f"{size[p]} {seconds(bounds[p])}" for p in line.points if p in bounds))
            facts.append(f"{line.fixed}, computing {', '.join(panel.outputs)}, by "
                         f"{line.param}: " + "; ".join(said) + ".")
    return {"title": "Time per call against problem size",
            "caption": "Median time per call with its distribution-free 95% confidence "
                       "interval at each size of the points that passed verification, one "
                       "line per kernel variant and baseline; the dashed line is the "
                       "speed-of-light bound each device-timed record carries (its minimum "
                       "work at the target's peaks). Under a tuned variant's point, the "
                       "tiles it ran, from its record. " + " ".join(facts)}


def plans(ev: Evidence, verified: list[str]) -> tuple[list, list]:
    """The scaling figure of ``ev``'s series over the ``verified`` points, or why it is
    withheld (a grid with no series has neither)."""
    found = series([p for p in ev.spec["points"] if p["name"] in ev.points])
    if not found:
        return [], []
    rows = []
    for line in found:
        kept = [(p, s) for p, s in zip(line.points, line.sizes, strict=True) if p in verified]
        if len(kept) < MIN_SIZES:
            continue
        shown = dataclasses.replace(line, points=tuple(p for p, _ in kept),
                                    sizes=tuple(s for _, s in kept))
        if drawn := panels(ev, shown.points):
            rows.append((shown, drawn))
    if not rows:
        return [], [{"figure": "scaling", "reason": f"no series (points differing in one size "
                     f"only) has {MIN_SIZES} verified sizes with a kernel or baseline timed at "
                     f"{MIN_POINTS} of them"}]
    return [("scaling", lambda path: figure(ev, rows, path))], []
