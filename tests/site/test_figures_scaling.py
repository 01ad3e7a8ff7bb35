"""The scaling figure: series found from a grid's params, drawn from synthetic and from the
committed TPU records, its labels readable (no two texts overlap)."""

from __future__ import annotations

import itertools

import pytest
from matplotlib.text import Text

from casebook.core import config, fmt, paths
from casebook.report import scaling
from casebook.report.evidence import DOES_NOT_FIT, Evidence, gather

TPU = {"mode": "Pallas Mosaic TPU kernel", "interpret": False, "poisoned": False,
       "race_detection": False, "device": "tpu"}
INTERPRETED = {**TPU, "interpret": True, "device": "cpu"}


def point(name: str, seq_len: int, **more) -> dict:
    return {"name": name, "params": {"heads": 16, "seq_len": seq_len, "head_dim": 128,
                                     "mask": {"kind": "causal"}, **more}}


def test_a_series_is_points_differing_in_one_integer_only():
    grid = [point("a", 4096), point("c", 16384), point("b", 8192),
            point("local", 8192, mask={"kind": "local"}),  # another mask: not in it
            point("d64", 8192, head_dim=64), point("d256", 8192, head_dim=256),
            point("flag", 4096, causal=True), point("flag2", 4096, causal=False)]
    found = scaling.series(grid)
    assert [(s.param, s.points, s.sizes) for s in found] == [
        ("head_dim", ("d64", "b", "d256"), (64, 128, 256)),
        ("seq_len", ("a", "b", "c"), (4096, 8192, 16384))]
    assert found[1].fixed == "head_dim 128 · mask causal"  # what varies elsewhere
    assert scaling.series(grid[:2]) == []  # two sizes are a ratio, not a trend
    assert scaling.series([point("x", 4096), point("y", 8192, heads=8),
                           point("z", 16384, head_dim=64)]) == []


def measurement(median: float) -> dict:
    return {"median_s": median, "ci_low_s": median * 0.98, "ci_high_s": median * 1.02}


def timed(median: float, bound: float, execution: dict = TPU, **more) -> dict:
    return {"timed": True, "execution": execution, "measurement": measurement(median),
            "speed_of_light": {"bound_s": bound, "fraction": bound / median}, **more}


def evidence(execution: dict = TPU) -> Evidence:
    """Three sizes: a forward and its backward timed at all, with tiles tuned from the
    second on; a baseline timed at two and out of memory at the third."""
    grid = [point(f"s{n}", n) for n in (4096, 8192, 16384)]
    checked = {n: {"passed": True, "ran": True, "sources_sha256": "s", "checks": [
        {"execution": execution, "outputs": {key: {} for key in outs}}]}
        for n, outs in (("fwd", ["out"]), ("bwd", ["dq", "dk", "dv"]))}
    table = {"applied": True, "key": "blocks", "tuned": {"block": 1024}}
    ev = Evidence(
        case="c", target="tpu-v5e", spec={"points": grid}, env={},
        host={"gpus": [], "tpus": [{"name": "TPU v5 lite"}]}, builds={},
        verify={(v, p["name"]): checked[v] for v in checked for p in grid}, time={},
        baselines={}, noise_floor=None, sources=[], kernel_sources_sha256="s")
    for i, p in enumerate(grid):
        name, n = p["name"], p["params"]["seq_len"]
        work = (n / 4096) ** 2 * 1e-3
        for variant, factor in (("fwd", 1), ("bwd", 3)):
            ev.time[variant, name] = timed(work * factor * (4 if i == 0 else 1.6),
                                           work * factor, execution,
                                           **({"tile_table": table} if i else {}))
            ev.tile_choices[variant, name] = {"hand": {"block": 128}}
        ev.baselines["dense", name] = (
            timed(work * 20, work, execution, check={"outputs": {"out": {}}}) if i < 2 else
            {"timed": False, "execution": execution,
             "not_timed_reason": f"{DOES_NOT_FIT}: RESOURCE_EXHAUSTED"})
    ev.baselines["gpu_only", "s4096"] = {"timed": False, "execution": execution,
                                         "not_timed_reason": "not run here: needs a GPU"}
    return ev


def rows(ev: Evidence) -> list:
    found = [(s, scaling.panels(ev, s.points)) for s in scaling.series(ev.spec["points"])]
    return [(s, p) for s, p in found if p]


def drawn_texts(fig) -> list[Text]:
    """Every text the figure draws: titles, axis labels, tick labels inside the view (one
    outside is never drawn), texts on the axes, the legend's and the figure's own."""
    fig.canvas.draw()
    found = [*fig.texts, *(t for legend in fig.legends for t in legend.get_texts())]
    for ax in (ax for ax in fig.axes if ax.get_visible()):
        found += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            found += [tick.label1 for tick in (*axis.get_major_ticks(),
                                               *axis.get_minor_ticks())
                      if low <= tick.get_loc() <= high]
    return [t for t in found if t.get_visible() and t.get_text().strip()]


def overlapping(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose extents meet."""
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in drawn_texts(fig)]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if box_a.overlaps(box_b)]


def test_the_figure_draws_each_line_against_size_with_its_bound_and_what_did_not_fit():
    ev = evidence()
    fig = scaling.draw(ev, rows(ev))
    forward, backward = (ax for ax in fig.axes if ax.get_visible())
    assert forward.get_title().endswith("computing out")  # the config's order
    assert backward.get_title().endswith("computing dq, dk, dv")
    assert forward.get_xscale() == "log" and forward.xaxis.get_transform().base == 2
    assert [t.get_text() for t in forward.get_xticklabels()] == ["4096", "8192", "16384"]
    # The bound, dashed, at each size: its records' bound in the axis's unit (ms).
    (sol,) = [line for line in forward.get_lines() if line.get_linestyle() == "--"]
    assert list(sol.get_ydata()) == pytest.approx(
        [ev.time["fwd", f"s{n}"]["speed_of_light"]["bound_s"] * 1e3
         for n in (4096, 8192, 16384)])
    # Out of memory is a mark at the top of the panel where its line is, never a time.
    (marks,) = [line for line in forward.get_lines() if line.get_marker() == "x"]
    assert list(marks.get_xdata()) == [16384]
    assert marks.get_transform() == forward.get_xaxis_transform()
    assert 0.5 < marks.get_ydata()[0] < 1
    dense = [line for line in forward.get_lines() if line.get_marker() == "^"]  # third
    assert [list(line.get_xdata()) for line in dense] == [[4096, 8192]]
    # Each tuned point says which tiles it ran, from its record.
    said = [t.get_text() for t in forward.texts]
    assert said == ["block 128\nuntuned", "block 1024\ntuned", "block 1024\ntuned"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:3] == ["fwd", "bwd", "baseline: dense"]  # never the untimed gpu_only
    assert "TPU-V5E (TPU v5 lite)" in fig.texts[0].get_text()
    assert overlapping(fig) == []
    backward.text(0.5, 1.01, "a clash", transform=backward.transAxes, va="bottom")
    assert [b for _, b in overlapping(fig)] == ["a clash"]  # the check sees one


def test_the_caption_states_every_drawn_number(tmp_path):
    ev = evidence()
    meta = scaling.figure(ev, rows(ev), str(tmp_path / "scaling.svg"))
    fwd = ev.time["fwd", "s8192"]
    assert (f"8192 {fwd['measurement']['median_s'] * 1e3:.3g} ms "
            f"({fwd['speed_of_light']['fraction']:.1%} of the speed of light; "
            "block 1024, tuned)") in meta["caption"]
    assert "baseline: dense does not fit in the device's memory at 16384" in meta["caption"]


def test_an_interpreted_figure_says_so_and_draws_no_speed_of_light():
    """Interpreter time says nothing about the device's speed: no bound is drawn beside it,
    and the face says where the time came from."""
    ev = evidence(INTERPRETED)
    ev.target, ev.host = "cpu", {"gpus": [], "cpu": {"model": "c"}}
    fig = scaling.draw(ev, rows(ev))
    assert "Pallas interpret mode on the host — not GPU time" in fig.texts[0].get_text()
    assert not [line for ax in fig.axes for line in ax.get_lines()
                if line.get_linestyle() == "--"]


def test_a_series_timed_at_one_size_is_withheld_and_a_grid_without_one_has_none():
    ev = evidence()
    for key in [k for k in ev.time if k[1] != "s4096"]:
        del ev.time[key]
    ev.baselines = {}
    plans, withheld = scaling.plans(ev, ev.points)
    assert plans == [] and withheld[0]["figure"] == "scaling"
    ev.spec = {"points": [point("a", 4096), point("b", 8192, heads=8)]}
    assert scaling.plans(ev, ev.points) == ([], [])


TPU_RECORDS = paths.SOURCE_ROOT / paths.RESULTS / "tpu-v5e" / "splash_attention" / "time"


@pytest.mark.skipif(not TPU_RECORDS.is_dir(), reason="no committed TPU records")
def test_the_committed_tpu_records_draw_without_overlapping_labels(tmp_path, monkeypatch):
    """Splash attention on the TPU v5e: upstream forward and backward against seq_len,
    tiles from each record, and what runs out of memory; every label readable."""
    monkeypatch.chdir(paths.SOURCE_ROOT)  # records are named relative to the checkout
    spec = config.load_case(str(paths.SOURCE_ROOT / "configs" / "cases"), "splash_attention")
    ev = gather(spec, "tpu-v5e", must_exist=False)
    verified = [p for p in ev.points
                if any(ev.verify.get((v, p), {}).get("passed") for v in ev.variants)]
    ((name, draw),), withheld = scaling.plans(ev, verified)
    assert (name, withheld) == ("scaling", [])
    found = rows(ev)
    assert [s.param for s, _ in found] == ["seq_len"]
    fig = scaling.draw(ev, found)
    assert overlapping(fig) == []
    meta = draw(str(tmp_path / "scaling.svg"))
    for (variant, point), record in ev.time.items():
        if record["timed"] and point in found[0][0].points:
            size = dict(zip(found[0][0].points, found[0][0].sizes, strict=True))[point]
            assert f"{size} {fmt.seconds(record['measurement']['median_s'])}" in \
                meta["caption"], (variant, point)
