"""The site's parts without a browser: status phrases, folding, tables, the noise floor."""

from __future__ import annotations

import html
import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest

from casebook.core import config, paths, records
from casebook.core.errors import CasebookError
from casebook.measure import stats
from casebook.report import conditions, methods, page_tables, site, status
from casebook.report.evidence import Evidence, honest_clock
from casebook.stages import timing

CPU = {"model": "Test CPU", "usable_cores": 2}
H200 = {"name": "NVIDIA H200"}


def measurement(median: float, spread: float) -> dict:
    return {"median_s": median, "ci_low_s": median - spread, "ci_high_s": median + spread,
            "relative_noise": spread / median, "stop_reason": "enough", "confidence": 0.95,
            "samples": 20}


def evidence(interpret: bool, gpus: list[dict], kernel_s: float, baseline_s: float,
             passed: bool = True) -> Evidence:
    execution = {"mode": "m", "interpret": interpret, "poisoned": False,
                 "race_detection": False}
    verify = {"passed": passed, "ran": True,
              "checks": [{"execution": execution, "outputs": {"out": {}}}],
              "sources_sha256": "s"}
    power = {"mutants": [{"name": "bias_1pct", "output": "out", "applicable": True,
                          "caught": True}],
             "controls": {"out": {"passed": True}}, "smallest_bias_detected": {"out": 1e-3}}
    return Evidence(
        case="c", target="h200" if gpus else "cpu", spec={"points": [{"name": "p"}]},
        env={}, host={"gpus": gpus, "cpu": CPU}, builds={},
        verify={("v", "p"): verify},
        time={("v", "p"): {"timed": passed, "execution": execution,
                           "measurement": measurement(kernel_s, kernel_s / 100)}},
        baselines={("b", "p"): {"timed": True, "execution": execution, "role": "without_work",
                                "check": {"outputs": {"out": {}}},
                                "measurement": measurement(baseline_s, baseline_s / 100)}},
        sources=[], kernel_sources_sha256="s", noise_floor=None, check_power={"p": power})


def compared(ev: Evidence, rng, floor: float | None, spread: float = 0.01) -> None:
    """The compare records of ``ev``'s points: its pairs (timing.comparable) on paired
    samples drawn around each record's median, as the compare stage measures them."""
    for point in ev.points:
        times = {v: r for (v, p), r in ev.time.items() if p == point}
        verified = {v: r for (v, p), r in ev.verify.items() if p == point}
        bases = {b: r for (b, p), r in ev.baselines.items() if p == point}
        pairs = timing.comparable(times, verified, bases, ev.host["gpus"])
        drift = np.exp(np.cumsum(rng.normal(0, 0.05, 40)))
        for pair in pairs:
            if "why_not" not in pair:
                kernel, base = (record["measurement"]["median_s"] * drift
                                * (1 + spread * rng.standard_normal(40))
                                for record in (times[pair["variant"]], bases[pair["baseline"]]))
                pair.update(rounds=40, **stats.compare_paired(kernel, base, 0.95,
                                                              floor).as_dict())
        ev.compare[point] = {"pairs": pairs}


def texts(ev: Evidence) -> list[str]:
    return [p["text"] for p in status.parts(ev)]


def test_interpret_mode_status_claims_no_speed():
    found = texts(evidence(interpret=True, gpus=[], kernel_s=1e-3, baseline_s=2e-3))
    assert found == ["verified (interpreted kernel) in interpret mode on the host CPU",
                     "timed in interpret mode on the host CPU only", "not measured on GPU"]


def test_variants_held_back_for_one_reason_are_named_in_one_phrase():
    ev = evidence(interpret=True, gpus=[], kernel_s=1e-3, baseline_s=2e-3)
    for variant, why in (("a", "needs a B200"), ("b", "needs a B200"), ("c", "needs a TPU")):
        ev.verify[variant, "p"] = {"ran": False, "not_run_reason": why}
    held = [t for t in texts(ev) if "not run here" in t]
    assert held == ["a, b not run here: needs a B200", "c not run here: needs a TPU"]


def test_device_status_names_the_gpu_and_the_ratio(tmp_path, monkeypatch, rng):
    monkeypatch.chdir(tmp_path)
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-3, baseline_s=1.4e-3)
    compared(ev, rng, floor=None)
    assert texts(ev) == ["verified (GPU kernel) on NVIDIA H200", "measured on NVIDIA H200",
                         "faster than b at 1 of 1 points"]  # no floor: no speedup printed
    compared(ev, rng, floor=0.02)
    *_, versus = texts(ev)
    # 1.4×, the median of 40 paired ratios each ~2% off: 1.30–1.49 is 30 of its sd away
    assert re.fullmatch(r"faster than b at 1 of 1 points, up to 1\.[34]\d×", versus)
    ev.baselines["b", "p"]["speed_of_light"] = {"fraction": 0.0031}  # the baseline's own
    *_, versus = texts(ev)
    assert re.fullmatch(r"faster than b at 1 of 1 points, up to 1\.[34]\d× "
                        r"\(there b runs at 0\.3% of SOL\)", versus)
    assert status.hardware(evidence(False, [H200, H200], 1, 1)) == "2× NVIDIA H200"


def test_a_gpu_host_status_names_device_and_interpreted_runs_apart(tmp_path, monkeypatch,
                                                                    rng):
    """On an H200 upstream's TPU kernel still runs in the interpreter beside the GPU
    kernels: the GPU kernels are verified and measured on the GPU, upstream is named as
    interpreted and host-timed, never the other way round."""
    monkeypatch.chdir(tmp_path)
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-3, baseline_s=1.4e-3)
    interpreted = {"mode": "TPU interpret", "interpret": True, "poisoned": False,
                   "race_detection": True}
    ev.verify["u", "p"] = {"passed": True, "ran": True, "sources_sha256": "s",
                           "checks": [{"execution": interpreted, "outputs": {"out": {}}}]}
    ev.time["u", "p"] = {"timed": True, "execution": interpreted,
                         "measurement": measurement(0.3, 0.003)}
    compared(ev, rng, floor=None)
    found = texts(ev)
    assert found[0] == ("verified (GPU kernel) on NVIDIA H200 and (interpreted kernel) in "
                        "interpret mode on the host CPU")
    assert found[1:3] == ["measured on NVIDIA H200",
                          "u timed on the host only (no GPU time)"]
    assert "not measured on GPU" not in found
    assert not ev.interpreted and ev.interpreted_timed == ["u"]
    for record in ev.time.values():  # what the measurement condition reads
        record["measurement"].update(clock="c", warmup_calls=3, cache={"description": "c"},
                                     throttling={"description": "t", "discarded": 0},
                                     guards={}, interval="within-run", pinned_cpu=None,
                                     clock_kind="c", stop_criterion="s")
    for record in ev.baselines.values():
        record["measurement"].update(ev.time["v", "p"]["measurement"])
    execution = next(line for line in conditions.measurement(ev)
                     if line.startswith("Execution"))
    assert execution == ("Execution on H200: m; TPU interpret — interpret-mode host time, "
                         "NOT GPU device time")


def test_a_device_class_no_record_comes_from_is_listed_as_never_run():
    """An architecture lowered for on a target with records, none of whose device classes
    has records, is each of those classes' row: never run; Hopper kernels with an H200
    record, or a case built for the host only, add none."""
    def built(target, *archs):
        ev = evidence(interpret=True, gpus=[], kernel_s=1, baseline_s=1)
        ev.target = target
        ev.builds = {f"v_{a}": {"points": [{"artifacts": [{"target": f"cuda {a}"},
                                                          {"target": "host"}]}]}
                     for a in archs}
        return ev
    rows = site.never_run([built("cpu", "sm_90a", "sm_100a")])
    assert [r["target"] for r in rows] == ["b200", "h100", "h200"]
    (b200,) = [r for r in rows if r["target"] == "b200"]
    assert b200["status"] == [{"text": "v_sm_100a lowered for sm_100a on cpu, never run on "
                                       "a B200: no record", "tone": "warn"}]
    assert [r["target"] for r in site.never_run([built("cpu", "sm_90a", "sm_100a"),
                                                 built("h200", "sm_90a")])] == ["b200"]
    assert site.never_run([built("cpu")]) == []


def test_only_kernels_and_baselines_computing_the_same_outputs_are_compared(rng):
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-3, baseline_s=1.4e-3)
    backward = {**ev.verify["v", "p"], "checks": [{"outputs": {"dq": {}, "dk": {}}}]}
    ev.verify["v_bwd", "p"] = backward
    ev.time["v_bwd", "p"] = ev.time["v", "p"]
    compared(ev, rng, floor=0.02)
    assert list(conditions.comparisons(ev)) == [("v", "b", "p")]
    assert conditions.not_compared(ev) == {}


def test_an_interpreted_kernel_is_not_set_against_a_native_baseline(rng):
    ev = evidence(interpret=True, gpus=[], kernel_s=1.0, baseline_s=1e-3)
    ev.baselines["b", "p"]["execution"] = {**ev.baselines["b", "p"]["execution"],
                                           "interpret": False}
    compared(ev, rng, floor=0.02)
    assert conditions.comparisons(ev) == {}
    (why,) = conditions.not_compared(ev).values()
    assert why.startswith("not compared: v ran as interpreted kernel, b as XLA on the host")


def test_a_check_that_lets_a_mutant_through_is_weak_in_red():
    ev = evidence(interpret=True, gpus=[], kernel_s=1, baseline_s=1)
    ev.check_power["p"]["mutants"].append({"name": "k_tile_dropped", "output": "out",
                                           "applicable": True, "caught": False})
    parts = status.parts(ev)
    assert {"text": "check WEAK at 1 of 1 verified points: lets out:k_tile_dropped pass",
            "tone": "bad"} in parts
    ev.check_power.clear()
    assert "check WEAK at 1 of 1 verified points: its power not measured" in texts(ev)


def test_a_weak_check_is_one_alarm_per_variant_naming_its_points():
    """The conditions panel shows an alarm line once per variant (never folded), each
    point's own line (folded) saying what the check lets through."""
    ev = evidence(interpret=True, gpus=[], kernel_s=1, baseline_s=1)
    ev.spec = {"points": [{"name": p} for p in ("p", "q", "r")],
               "tolerances": {"float32": {"atol": 0, "rtol": 1e-6, "reason": "r"}}}
    record = {**ev.verify["v", "p"], "oracle": "o", "worst_error_over_tolerance": 0.5,
              "max_abs_error": 1e-7, "trials": 2, "seed": 1, "races_found": False,
              "failures": []}
    strong = ev.check_power["p"]
    weak = {**strong, "mutants": [
        {"name": "k_tile_dropped", "output": "out", "applicable": True, "caught": False}]}
    for point in ("p", "q", "r"):
        ev.verify["v", point] = record
        ev.check_power[point] = weak if point != "r" else strong
    lines = conditions.correctness(ev)
    alarms = [line for line in lines if site.ALARMS["bad"].search(line)]
    assert alarms == ["v: check power WEAK at 2 of 3 verified points (p, q); each point's "
                      "line says what it lets through"]
    assert sum("lets out:k_tile_dropped pass" in line for line in lines) == 2
    for point in ("p", "q", "r"):  # another variant weak at the same points: one line
        ev.verify["w", point] = record
    alarms = [line for line in conditions.correctness(ev) if site.ALARMS["bad"].search(line)]
    assert alarms == ["v, w: check power WEAK at 2 of 3 verified points each (p, q); each "
                      "point's line says what it lets through"]


def test_a_point_checked_on_sampled_rows_says_what_checked_every_element():
    ev = evidence(interpret=False, gpus=[], kernel_s=1, baseline_s=1)
    ev.spec = {"points": [{"name": "p"}],
               "tolerances": {"float32": {"atol": 0, "rtol": 1e-6, "reason": "r"}}}
    every = {"passed": True, "reference": "float32 reference on TPU v5 lite (x)",
             "elements": 64, "elements_over": 0, "worst_error_over_tolerance": 0.25}
    check = {"passed": True, "outputs": {
        "dq": {"passed": True, "sampled": {"rows": 4, "of": 8, "seed": 1,
                                            "worst_error_over_tolerance": 0.125},
               "every_element": every},
        "dk": {"passed": True, "every_element": {**every, "worst_error_over_tolerance": 0.5}}}}
    ev.verify["v", "p"] = {**ev.verify["v", "p"], "oracle": "o", "checks": [check],
                           "worst_error_over_tolerance": 0.5, "max_abs_error": 1e-7,
                           "trials": 1, "seed": 1, "races_found": False, "failures": []}
    [line] = [x for x in conditions.correctness(ev) if x.startswith("v @ p")]
    assert ("every element also checked against the float32 reference on TPU v5 lite (x) "
            "(worst 0.5×; the sampled float64 rows' worst 0.125×)") in line
    check["outputs"]["dk"]["every_element"] |= {"worst_error_over_tolerance": None,
                                                 "elements_over": 3, "passed": False}
    [line] = [x for x in conditions.correctness(ev) if x.startswith("v @ p")]
    assert ("(worst undefined: non-finite, 3 elements over; the sampled float64 rows' worst "
            "0.125×)") in line
    del check["outputs"]["dq"]["every_element"], check["outputs"]["dk"]["every_element"]
    [line] = [x for x in conditions.correctness(ev) if x.startswith("v @ p")]
    assert "every element" not in line


def test_the_status_names_a_numerics_model_as_what_was_verified():
    ev = evidence(interpret=False, gpus=[], kernel_s=1, baseline_s=1)
    ev.verify["v", "p"]["checks"][0]["execution"] = {
        "mode": "numpy", "interpret": False, "poisoned": False, "race_detection": False,
        "subject": "numerics model"}
    assert texts(ev)[0] == "verified (numerics model) on Test CPU CPU (2 cores), no GPU"


def test_a_page_states_each_protocol_with_the_kind_of_execution_measured_so():
    """A host stand-in (short protocol, hot cache) beside an XLA baseline (the full one):
    the page's warm-up and cache lines name both, never only the first record's."""
    ev = evidence(interpret=True, gpus=[], kernel_s=1, baseline_s=1e-3)

    def protocol(warmup, cache, clock="host"):
        return {"clock": clock, "clock_kind": clock, "warmup_calls": warmup,
                "cache": {"description": cache}, "interval": "within-run",
                "throttling": {"description": "none seen", "discarded": 0},
                "pinned_cpu": None, "stop_criterion": "fixed_count",
                "guards": {"early_return": {"detail": "ok"}}}
    ev.time["v", "p"]["measurement"].update(protocol(1, "hot: one input set"))
    ev.baselines["b", "p"]["execution"] = {"mode": "XLA", "interpret": False}
    ev.baselines["b", "p"]["measurement"].update(protocol(3, "cold: 4 sets rotated"))
    lines = conditions.measurement(ev)
    assert "Clock: host" in lines and "Throttling: none seen" in lines
    assert ("Warm-up: 1 calls discarded (interpreted kernel); 3 calls discarded "
            "(XLA on the host CPU)") in lines
    assert ("Cache state: hot: one input set (interpreted kernel); cold: 4 sets rotated "
            "(XLA on the host CPU)") in lines
    assert any(line.startswith("Guards passed by every timed record") and "v @ p's" in line
               for line in lines)


def test_a_failed_verification_reads_as_a_failure():
    parts = status.parts(evidence(interpret=True, gpus=[], kernel_s=1, baseline_s=1,
                                  passed=False))
    assert parts[0] == {"text": "verification FAILED at 1 of 1 points", "tone": "bad"}


def test_folding_never_hides_an_alarm():
    six = {"correctness": ["a", "b", "c", "v @ p: FAILED: trial 0", "d"],
           "reproduction": ["only"]}
    folded = site.panel(six)
    shown = [line["text"] for line in folded["correctness"]["shown"]]
    assert shown == ["a", "v @ p: FAILED: trial 0"]  # the first line names the condition
    assert [line["text"] for line in folded["correctness"]["more"]] == ["b", "c", "d"]
    assert folded["correctness"]["shown"][1]["alarm"] == "bad"
    assert folded["reproduction"] == {"shown": [{"text": "only", "alarm": None}], "more": []}


def test_tables_escape_every_cell_and_mark_failures():
    html = page_tables._html([{"what": "<script>x</script>", "record": "data/a&b.json"},
                         {"what": "ok", "record": None}], [True, False], "t")
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert '<a href="data/a&amp;b.json">json</a>' in html
    assert html.count("fail") == 2  # both cells of the failed row, none of the other


def test_a_kernel_that_did_not_run_shows_no_draws_error_or_races():
    ev = evidence(interpret=True, gpus=[], kernel_s=1e-3, baseline_s=2e-3)
    ev.verify[("v", "p")].update(ran=False, passed=False, trials=3, max_abs_error=0.0,
                                 worst_error_over_tolerance=None, races_found=False,
                                 seed=1, not_run_reason="lowered only, never run")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", page_tables.verification(ev, lambda p: p))
    assert cells[:7] == ["v", "p", "not run here: lowered only, never run", "—", "—", "—", "—"]


def test_no_noise_floor_record_is_said_plainly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ev = evidence(interpret=True, gpus=[], kernel_s=1e-3, baseline_s=2e-3)
    floor = methods.noise_floor("cpu", [ev], site.publish)
    assert floor["recorded"] is None
    assert floor["observed"] == {"n": 2, "low": "1.0%", "high": "1.0%", "median": "1.0%"}


def test_a_corrupt_noise_floor_record_names_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record = tmp_path / paths.noise_floor_record("cpu")
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"floor": 0.01}))
    with pytest.raises(CasebookError, match=r"results/cpu/noise_floor\.json: schema_version"):
        methods.noise_floor("cpu", [], site.publish)


def test_a_small_speedup_keeps_its_significant_digits():
    """An interpreter 250× slower than XLA reads 0.004×, never 0.00×."""
    slow = stats.Comparison(speedup=0.00412, low=0.00398, high=0.00431, floor=0.05,
                            verdict=stats.SLOWER)
    assert conditions.comparison_text(slow).startswith("SLOWER: 0.00412× [0.00398, 0.00431]")


def test_numerics_notes_are_stated_on_the_case_page_and_subnormals_on_methods(
        tmp_path, monkeypatch):
    """Case 01's limits of verification (subnormals flushed in the interpreter) under their
    heading, and the methods page's statement beside the verification rules."""
    monkeypatch.chdir(tmp_path)
    site.case_page("configs/cases", "moe_nvfp4", [], [], "t", "page", "page.json")
    site.methods_page("configs/cases", ["moe_nvfp4"], [], [], "t", {}, "methods")

    def text(page):
        """The page's words, without tags."""
        return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", Path(page).read_text())).split())

    note = config.load_case("configs/cases", "moe_nvfp4")["numerics_notes"]
    assert "Subnormal inputs are flushed to zero in the interpreter" in note
    assert f"Limits of verification {note}" in text(paths.site_page("moe_nvfp4", "page"))
    assert ("Subnormals Interpret mode and the CPU XLA baselines run on XLA on the host CPU, "
            "which flushes subnormal floats to zero") in text(paths.site_methods("methods"))


def test_correctness_labels_never_overlap_however_many_bars():
    from casebook.report import figures

    ev = evidence(interpret=True, gpus=[], kernel_s=1, baseline_s=1)
    record = {**ev.verify["v", "p"], "worst_error_over_tolerance": 0.3}
    ev.verify["v", "p"] = record
    for variant in ("mgpu", "mgpu_mask_tiles", "mgpu_bwd", "upstream", "upstream_bwd"):
        for point in ("mha_causal_f16", "gqa_local_bf16", "mqa_causal_bf16",
                      "packed_softcap_f16"):
            ev.verify[variant, point] = record
    fig = figures.draw_correctness(ev)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    boxes = [t.get_window_extent(renderer) for t in ax.get_yticklabels() if t.get_text()]
    assert len(boxes) == len(ev.ran) == 21
    for i, first in enumerate(boxes):
        for second in boxes[i + 1:]:
            assert not first.overlaps(second), (first, second)


def test_the_problem_grid_prints_integers_as_integers():
    spec = {"name": "c", "points": [
        {"name": "tiled", "params": {"seq_len": 256, "tiles": {"block_q": 128}, "cap": 2.5}},
        {"name": "plain", "params": {"seq_len": 512}}]}
    grid = page_tables.points(spec)
    assert ">128<" in grid and ">512<" in grid and ">2.5<" in grid
    assert "128.0" not in grid and "—" in grid  # a missing cell is a dash, not NaN


def test_a_page_whose_inputs_do_not_read_back_is_rendered_as_failed(tmp_path, monkeypatch):
    """A corrupt manifest: the page says so with the error, its status records it, and the
    index marks the case failed, linking only the page that exists."""
    monkeypatch.chdir(tmp_path)
    manifest = Path(paths.figure_manifest("moe_nvfp4", "cpu"))
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"schema_version": 1, "kind": "mani')
    status = "pages/moe_nvfp4.json"
    site.case_page("configs/cases", "moe_nvfp4", ["cpu"], [], "t", "page", status)
    record = json.loads(Path(status).read_text())
    assert record["ok"] is False and record["error"].startswith(
        f"{manifest}: corrupt or truncated JSON")
    page = Path(paths.site_page("moe_nvfp4", "page")).read_text()
    assert "could not be rendered" in page and html.escape(str(manifest)) in page
    assert sorted(p.name for p in Path("page").rglob("*")) == ["moe_nvfp4.html"]
    site.index("configs/cases", ["moe_nvfp4"], {"moe_nvfp4": ["cpu"]}, [], "t", "index",
               {"moe_nvfp4": status})
    index = Path(paths.site_index("index")).read_text()
    assert "FAILED to render" in index and "corrupt or truncated JSON" in index
    assert set(re.findall(r'href="([^"#]+\.html)', index)) == {
        "index.html", "methods.html", "moe_nvfp4.html"}


def test_the_index_gives_the_best_fraction_of_sol_among_current_records_where_any_is():
    """A stale record's fraction (made from other sources) does not stand as today's
    best beside a current one; where every record is stale, its best is given and said
    to be stale."""
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    ev.time["v", "p"]["speed_of_light"] = {"fraction": 0.42}
    ev.time["v", "q"] = {**ev.time["v", "p"], "point": "q",
                         "speed_of_light": {"fraction": 0.65}}
    ev.verify["v", "q"] = {**ev.verify["v", "p"], "sources_sha256": "older"}
    ev.current_sha256 = {("v", "q"): "current"}
    said = {b["text"]: b for b in status.badges(ev)}
    assert "65% of SOL" not in said and said["STALE"]["tone"] == "bad"
    assert said["42% of SOL"]["title"].endswith("among the current records")
    ev.current_sha256[("v", "p")] = "current"
    ev.verify["v", "p"] = {**ev.verify["v", "p"], "sources_sha256": "older"}
    said = {b["text"]: b for b in status.badges(ev)}
    assert "42% of SOL" not in said and "in a stale record" in said["65% of SOL"]["title"]


def test_a_chip_that_ran_no_variant_names_the_baselines_it_timed():
    """Case 01 on a TPU: no variant runs there, both baselines are device-timed; the index
    says "not timed" for the port and "baselines: device time" (named on hover), never for
    a host-timed baseline or on a host without an accelerator."""
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    ev.time["v", "p"] = {"timed": False, "not_timed_reason": "not run here: a GPU kernel"}
    ev.baselines["a", "p"] = {**ev.baselines["b", "p"]}
    said = {b["text"]: b for b in status.badges(ev)}
    assert said["not timed"]["tone"] == "warn"
    assert said["baselines: device time"]["title"] == "baselines measured on NVIDIA H200: a, b"
    assert "baselines measured on NVIDIA H200: a, b" in texts(ev)
    ev.time["v", "p"] = {"timed": True, "execution": {"interpret": True},
                         "measurement": measurement(1e-3, 1e-5)}  # a host stand-in's time
    assert "baselines: device time" in {b["text"] for b in status.badges(ev)}
    ev.baselines["a", "p"] = {**ev.baselines["a", "p"], "execution": {
        **ev.baselines["a", "p"]["execution"], "device": "cpu"}}
    ev.baselines["b", "p"] = {**ev.baselines["b", "p"], "timed": False}
    assert "baselines: device time" not in {b["text"] for b in status.badges(ev)}
    ev = evidence(interpret=False, gpus=[], kernel_s=1e-5, baseline_s=2e-5)
    ev.time["v", "p"] = {"timed": False, "not_timed_reason": "not run here"}
    assert not [t for t in texts(ev) if t.startswith("baselines measured")]


def test_the_index_badges_say_what_the_case_page_says_in_a_few_words():
    """Verified n/m, FAILED, not run here (the reason on hover), WEAK, where it was timed,
    the best paired speedup, the best fraction of the speed of light, STALE."""
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    ev.time["v", "p"]["speed_of_light"] = {"fraction": 0.42}
    compared(ev, np.random.default_rng(0), floor=0.01)
    said = {b["text"]: b for b in status.badges(ev)}
    assert list(said)[:2] == ["verified 1/1", "device time"]
    assert said["device time"]["title"] == "measured on NVIDIA H200"
    assert said["2.0× faster"]["title"] == "v against b at p (paired, FASTER)"
    ev.baselines["b", "p"]["speed_of_light"] = {"fraction": 0.21}
    assert {b["text"]: b for b in status.badges(ev)}["2.0× faster"]["title"] == \
        "v against b at p (paired, FASTER); b there at 21.0% of SOL"
    del ev.baselines["b", "p"]["speed_of_light"]
    assert said["42% of SOL"]["tone"] == "note"
    ev.verify["w", "p"] = {**ev.verify["v", "p"], "passed": False}
    ev.verify["x", "p"] = {"ran": False, "not_run_reason": "needs a B200"}
    ev.current_sha256 = {("v", "p"): "made from other sources"}
    said = {b["text"]: b for b in status.badges(ev)}
    assert said["verified 1/2"]["tone"] == said["FAILED 1"]["tone"] == "bad"
    assert said["1 not run here"]["title"] == "needs a B200"
    assert said["STALE"]["tone"] == "bad"
    ev.check_power["p"]["mutants"][0]["caught"] = False
    assert "WEAK 2/2" in {b["text"] for b in status.badges(ev)}


def test_the_index_speedup_is_the_best_current_one_a_stale_one_only_when_none_is():
    """As the fraction of the speed of light: a stale record's larger speedup would read
    as today's, so the badge takes the current records' best, and says so otherwise."""
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    ev.spec = {"points": [{"name": "p"}, {"name": "q"}]}
    ev.verify["v", "q"] = {**ev.verify["v", "p"], "sources_sha256": "old"}
    ev.time["v", "q"] = ev.time["v", "p"]
    ev.baselines["b", "q"] = {**ev.baselines["b", "p"], "measurement": measurement(5e-5, 5e-7)}
    compared(ev, np.random.default_rng(0), floor=0.01)
    ev.current_sha256 = {("v", "p"): "s", ("v", "q"): "s"}
    said = {b["text"]: b for b in status.badges(ev)}
    assert said["2.0× faster"]["title"] == "v against b at p (paired, FASTER)"
    ev.current_sha256 = {("v", "p"): "new", ("v", "q"): "s"}  # now p is stale, q current
    ev.verify["v", "q"]["sources_sha256"] = "s"
    assert "v against b at q" in {b["text"]: b for b in status.badges(ev)}["5.0× faster"]["title"]
    ev.current_sha256 = {("v", "p"): "new", ("v", "q"): "new"}  # both stale: the best of all
    title = {b["text"]: b for b in status.badges(ev)}["5.0× faster"]["title"]
    assert title.endswith("in a stale record (no current comparison is FASTER)")


def test_a_comparison_older_than_a_record_it_pairs_is_stale_wherever_it_is_shown():
    """A compare record is remade after the verify, time and baseline records it pairs;
    one older than any of them (an archive's, where a window stopped before remaking it)
    measured what they replaced: its verdicts say STALE, and the index's speedup passes
    it over for a current one."""
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    ev.spec = {"points": [{"name": "p"}, {"name": "q"}]}
    ev.verify["v", "q"] = dict(ev.verify["v", "p"])
    ev.time["v", "q"] = dict(ev.time["v", "p"])
    ev.baselines["b", "q"] = {**ev.baselines["b", "p"], "measurement": measurement(5e-5, 5e-7)}
    compared(ev, np.random.default_rng(0), floor=0.01)
    for kept in (ev.verify, ev.time, ev.baselines):
        for record in kept.values():
            record["created_at"] = "2026-12-07T10:00:00+00:00"
    for point in ("p", "q"):
        ev.compare[point]["created_at"] = "2026-12-07T10:05:00+00:00"
    assert not ev.stale and "5.0× faster" in {b["text"] for b in status.badges(ev)}
    ev.baselines["b", "q"]["created_at"] = "2026-12-07T11:00:00+00:00"  # remade since
    assert ev.compare_stale("q") and not ev.compare_stale("p") and ev.stale
    said = {b["text"]: b for b in status.badges(ev)}
    assert "5.0× faster" not in said and said["2.0× faster"]["title"].endswith("(paired, FASTER)")
    assert "FASTER (STALE)" in page_tables.comparisons(ev)
    versus = [t for t in texts(ev) if t.startswith("faster than b")]
    assert re.fullmatch(r"faster than b at 2 of 2 points, up to [12]\.\d\d×", versus[0]), versus
    table = page_tables.summary([ev], True)
    assert "vs b (STALE: compared before these records)" in table
    assert "h200 (STALE)" in table
    ev.time["v", "q"]["created_at"] = ev.baselines["b", "q"]["created_at"] = \
        "2026-12-07T09:00:00+00:00"
    assert not ev.compare_stale("q")


def test_a_check_power_record_of_other_sources_is_stale_on_the_page():
    """Its mutants were judged by another check, or made from other kernels: the row says
    its power is STALE, and the target is."""
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    ev.check_power["p"]["sources_sha256"] = "then"
    ev.current_sha256 = {("v", "p"): "s", (None, "p"): "then"}
    table = page_tables.summary([ev], True)
    assert "every mutant caught<" in table and "STALE" not in table and not ev.stale
    ev.current_sha256[None, "p"] = "now"
    table = page_tables.summary([ev], True)
    assert "every mutant caught (STALE: other sources)" in table and "h200 (STALE)" in table
    assert ev.power_stale("p") and ev.stale and "STALE" in {b["text"] for b in status.badges(ev)}


def test_the_case_page_opens_with_every_device_timed_result_the_host_times_apart():
    """One row per target, variant and point timed on a device (the host's interpreter
    times in a table of their own): verified with its worst error, the check's power,
    median and interval, the paired verdicts, the fraction of the speed of light; a WEAK
    or failed check marks its row."""
    device = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    device.time["v", "p"]["speed_of_light"] = {"fraction": 0.42}
    device.verify["v", "p"]["worst_error_over_tolerance"] = 0.25
    compared(device, np.random.default_rng(0), floor=0.01)
    host = evidence(interpret=True, gpus=[], kernel_s=1e-3, baseline_s=2e-3)
    def cells(on_device: bool) -> list[list[str]]:
        rows = re.findall(r"<tr>(.*?)</tr>", page_tables.summary([host, device], on_device),
                          re.S)[1:]
        return [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]

    (row,) = cells(on_device=True)
    assert row[:3] == ["h200", "v", "p"]
    assert row[3] == "passed (0.25 of tol.)" and row[4] == "every mutant caught"
    assert re.fullmatch(r"FASTER [12]\.\d\d× \[[\d.]+, [\d.]+\] vs b", row[7])
    assert row[8] == "42.0%"
    (row,) = cells(on_device=False)
    assert row[0] == "cpu" and row[8] == "—"  # no fraction of SOL for an interpreter
    assert ' fail"' not in page_tables.summary([host, device], on_device=False)
    host.check_power["p"]["mutants"][0]["caught"] = False
    weak = page_tables.summary([host, device], on_device=False)
    assert "WEAK: " in weak and ' fail"' in weak
    device.current_sha256 = {("v", "p"): "made from other sources"}  # a stale row says so
    (row,) = cells(on_device=True)
    assert row[0] == "h200 (STALE)"
    assert ' fail"' in page_tables.summary([device], on_device=True)
    device.builds, device.current_sha256 = {"v": {"sources_sha256": "s"}}, {("v", None): "new"}
    assert cells(on_device=True)[0][0] == "h200 (STALE)"
    device.current_sha256, device.retuned = {}, [("v", "p")]
    assert cells(on_device=True)[0][0] == "h200 (STALE)"


def test_the_glance_table_says_why_a_result_has_no_verdict_and_how_fast_a_baseline_is():
    """Where every baseline computing the kernel's outputs was not timed at a point (it
    ran out of the device's memory), the glance table says so instead of a dash; a
    baseline computing other outputs (forward only, against a backward) is not named. A
    verdict names its baseline's own fraction of the speed of light where it has one."""
    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-5, baseline_s=2e-5)
    for point in ("big", "p"):
        ev.verify["v", point] = ev.verify["v", "p"]
        ev.time["v", point] = ev.time["v", "p"]
    oom = "does not fit in the device's memory: RESOURCE_EXHAUSTED: 16.75G of 15.75G"
    ev.baselines["b", "big"] = {"timed": False, "not_timed_reason": oom, "role": "without_work"}
    ev.baselines["c", "big"] = {"timed": False, "not_timed_reason": oom, "role": "without_work"}
    ev.baselines["c", "p"] = {**ev.baselines["b", "p"],
                              "check": {"outputs": {"dq": {}}}}  # computes other outputs
    compared(ev, np.random.default_rng(1), floor=0.01)
    rows = re.findall(r"<tr>(.*?)</tr>", page_tables.summary([ev], on_device=True), re.S)[1:]
    said = {cells[2]: cells[7] for cells in
            (re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows)}
    assert said["big"] == "not compared: b: does not fit in the device&#39;s memory"
    ev.baselines["b", "big"]["not_timed_reason"] = "not run here: b has no soft cap"
    assert page_tables.untimed_baselines(ev, "v", "big") == \
        "not compared: b: not run here: b has no soft cap"
    ev.baselines["b", "big"]["not_timed_reason"] = oom
    assert said["p"].startswith("FASTER") and said["p"].endswith(" vs b")
    ev.baselines["b", "p"]["speed_of_light"] = {"fraction": 0.003}  # a baseline's own bound
    assert page_tables.summary([ev], on_device=True).count(" vs b (itself at 0.3% of SOL)") == 1
    del ev.baselines["b", "big"]
    assert page_tables.untimed_baselines(ev, "v", "big") is None


def test_the_index_is_one_matrix_of_cases_and_targets(tmp_path, monkeypatch):
    """A row per case, a column per target (cpu first), each cell the hardware linking to
    the target's section and its badges; the TPU's committed records read back."""
    statuses = {}
    for case in ("splash_attention", "moe_nvfp4"):
        statuses[case] = str(tmp_path / f"{case}.json")
        records.write(statuses[case], "page", {"case": case, "ok": True, "error": None})
    root = str(tmp_path / "site")
    site.index("configs/cases", list(statuses), {c: ["tpu-v5e"] for c in statuses},
               [], "t", root, statuses)
    index = Path(paths.site_index(root)).read_text()
    heads = re.findall(r'<th scope="col">([^<]+)</th>', index)
    assert heads[:3] == ["case", "cpu", "tpu-v5e"]
    assert 'href="splash_attention.html#target-tpu-v5e">TPU v5 lite</a>' in index
    assert '<tr id="case-splash_attention">' in index and '<tr id="case-moe_nvfp4">' in index
    assert "faster</span>" in index and "verified " in index


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_publishing_merges_the_parts_and_replaces_the_site_whole(tmp_path):
    site_dir, a, b = tmp_path / "public", tmp_path / "a", tmp_path / "b"
    stamp = ".snakemake_timestamp"  # Snakemake's, never published
    for part, files in ((a, {"a.html": "A", "data/cpu/host.json": "H"}),
                        (b, {"b.html": "B", stamp: ""})):
        for name, text in files.items():
            (part / name).parent.mkdir(parents=True, exist_ok=True)
            (part / name).write_text(text)
    (site_dir / "gone").mkdir(parents=True)
    (site_dir / "gone" / "old.html").write_text("old")
    site.publish_site([str(a), str(b)], str(site_dir))
    assert _tree(site_dir) == {"a.html": b"A", "b.html": b"B", "data/cpu/host.json": b"H"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "public"]


@pytest.mark.parametrize("texts", [("H1", "H2"), ("H", "H")], ids=["differ", "same"])
def test_two_parts_making_one_file_leave_the_published_site_as_it_was(tmp_path, texts):
    site_dir, a, b = tmp_path / "public", tmp_path / "a", tmp_path / "b"
    for part, text in zip((a, b), texts, strict=True):
        (part / "data").mkdir(parents=True)
        (part / "data" / "host.json").write_text(text)
    site_dir.mkdir()
    (site_dir / "index.html").write_text("published")
    with pytest.raises(CasebookError,
                       match=r"host\.json: data/host\.json is made by another part"):
        site.publish_site([str(a), str(b)], str(site_dir))
    assert _tree(site_dir) == {"index.html": b"published"}


def test_only_a_record_made_from_another_slice_is_stale():
    ev = evidence(True, [], 1.0, 1.0)
    assert not ev.stale  # nothing to compare with
    ev.current_sha256 = {("v", "p"): "s", ("v", "q"): "other"}  # no record at q
    assert not ev.stale
    ev.current_sha256[("v", "p")] = "t"
    assert ev.stale


def test_the_methods_rule_declares_every_module_whose_docstrings_the_page_quotes():
    assert {Path(m.__file__).resolve() for m in methods.QUOTED} == set(paths.METHODS_QUOTES)
    quoting = "".join(inspect.getsource(f) for f in (methods.verification_rules,
                                                      methods.measurement_rules))
    used = set(re.findall(r"\b([a-z_]+)\.[A-Za-z_]+", quoting)) - {"c", "f", "doc"}
    assert used <= {m.__name__.rpartition(".")[2] for m in methods.QUOTED}, used


def _benchmark_records(tmp_path, false_aa: int, found_5: int, inside: float):
    """Calibration and coverage records shaped as the benchmarks write them."""
    calibration = {"commit": "c0ffee" * 4, "created_at": "2026-12-04T15:00:00+00:00",
                   "aa_trials": 200, "aa_verdicts": {"FASTER": false_aa, "SLOWER": 0,
                                                     "SAME": 200 - false_aa},
                   "aa_false_share": false_aa / 200, "noise_floor": 0.0123,
                   "targets": {"aa_false_share_max": 0.05, "detected_share_min": 0.95},
                   "ab": {"5%": {"trials": 100, "verdicts": {"FASTER": found_5}}}}
    coverage = {"target": 0.95, "floors": {"config": [{"paired_floor": 0.0137}]},
                "coverage": {"config": {"a_matmul": {"pairs_inside": inside,
                                                     "runs": [{}] * 20}}}}
    found = []
    for name, data in (("calibration_paired", calibration), ("rerun_coverage", coverage)):
        path = tmp_path / "benchmarks" / "results" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        found.append(path)
    return tuple(found)


def test_the_methods_page_states_the_engines_calibration_and_rerun_coverage(
        tmp_path, monkeypatch, rng):
    false_aa, found_5 = int(rng.integers(0, 11)), int(rng.integers(90, 101))
    inside = float(rng.uniform(0.5, 1))
    monkeypatch.setattr(paths, "SOURCE_ROOT", tmp_path)
    monkeypatch.setattr(paths, "PROTOCOL_CHECKS",
                        _benchmark_records(tmp_path, false_aa, found_5, inside))
    rows = {r["check"]: r for r in methods.protocol_checks()}
    aa = rows["A/A trials, paired design: false verdicts"]
    low, high = stats.share_interval(false_aa, 200, 0.95)  # exact: 0 of 200 is not 0%
    assert aa["result"] == (f"{false_aa} of 200 ({false_aa / 200:.1%}, 95% interval "
                            f"{low:.1%}–{high:.1%}); floor ±1.23%")
    assert high > false_aa / 200 >= low
    made = "benchmarks/results/calibration_paired.json (2026-12-04, c0ffeec0ffee"
    assert aa["benchmark record"] == made + ")"
    records = paths.PROTOCOL_CHECKS
    dirty = {**json.loads(records[0].read_text()), "commit": "c0ffee" * 4 + "-dirty"}
    records[0].write_text(json.dumps(dirty))
    assert methods.protocol_checks()[0]["benchmark record"] == made + "-dirty)"
    assert rows["a true 5% difference, paired design: found"]["result"] == f"{found_5} of 100"
    assert rows["reruns of a_matmul inside each other's intervals"]["result"].startswith(
        f"{inside:.1%} of ordered pairs of 20")
    assert rows["the paired A/A floor, 1 reruns"]["result"] == "±1.4%"


def test_a_corrupt_benchmark_record_is_named(tmp_path, monkeypatch):
    records = _benchmark_records(tmp_path, 0, 100, 1.0)
    data = json.loads(records[0].read_text())
    del data["aa_verdicts"]
    records[0].write_text(json.dumps(data))
    monkeypatch.setattr(paths, "SOURCE_ROOT", tmp_path)
    monkeypatch.setattr(paths, "PROTOCOL_CHECKS", records)
    with pytest.raises(CasebookError, match=r"calibration_paired\.json.*aa_verdicts"):
        methods.protocol_checks()


def test_the_committed_benchmark_records_are_on_the_methods_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    site.methods_page(str(paths.SOURCE_ROOT / "configs" / "cases"),
                      ["moe_nvfp4"], [], [], "t", {}, "methods")
    page = Path(paths.site_methods("methods")).read_text()
    assert "How the protocol was checked" in page
    for path in paths.PROTOCOL_CHECKS:
        assert str(path.relative_to(paths.SOURCE_ROOT)) in page
        assert f'href="{path.relative_to(paths.SOURCE_ROOT)}' not in page  # not published


@pytest.mark.parametrize("execution, clock, shown", [
    ({"interpret": True, "device": "gpu"}, "cupti_kernel", False),  # its launches only
    ({"interpret": False, "device": "cpu"}, "cuda_event", False),  # a host model
    ({"interpret": True, "device": "cpu"}, "host", True),
    ({"interpret": False, "device": "gpu"}, "cupti_kernel", True),
    ({"interpret": False}, "cuda_event", True),  # a device kernel (no device named)
])
def test_host_work_timed_by_a_device_clock_is_shown_as_not_timed(execution, clock, shown):
    record = {"timed": True, "execution": {"mode": "m", "poisoned": False,
                                           "race_detection": False, **execution},
              "measurement": {"clock_kind": clock, "median_s": 1e-4}}
    out = honest_clock(record)
    assert out["timed"] is shown
    if shown:
        assert out is record
    else:
        assert "measurement" not in out
        assert out["not_timed_reason"] == (
            f"not measurable: timed by the {clock} clock though its work ran on the host: "
            "that clock counted only the device launches it made")
    untimed = {**record, "timed": False, "not_timed_reason": "x"}
    assert honest_clock(untimed) is untimed


def test_a_bit_exact_kernel_is_named_on_the_error_figure_not_left_without_a_bar():
    """A log axis draws no bar for a zero error: the row says it in words, beside a bar
    that is drawn for a nonzero one; a row without a ratio says that."""
    from casebook.report import figures

    ev = evidence(interpret=True, gpus=[], kernel_s=1, baseline_s=1)
    base = ev.verify["v", "p"]
    for variant, worst in (("v", None), ("exact", 0.0), ("close", 0.25), ("unratioed", None)):
        ev.verify[variant, "p"] = {**base, "worst_error_over_tolerance": worst}
    ax = figures.draw_correctness(ev).axes[0]
    words = [t.get_text() for t in ax.texts]
    assert words.count("0: bit-exact") == 1 and words.count("no ratio (exact only)") == 2
    widths = sorted(p.get_width() for p in ax.patches if np.isfinite(p.get_width()))
    assert widths == [0.25] and ax.get_xlim()[0] < 0.25


def test_the_timing_figure_sets_a_backward_apart_from_forward_baselines_in_plain_units():
    """One panel per set of outputs computed: a backward (dq, dk, dv) is never a bar
    beside forward baselines; times under a millisecond read in µs, and no tick label
    is written as a power of ten."""
    from casebook.report import figures

    ev = evidence(interpret=False, gpus=[H200], kernel_s=9e-6, baseline_s=12e-6)
    grads = {"dq": {}, "dk": {}, "dv": {}}
    ev.verify["bwd", "p"] = {**ev.verify["v", "p"], "checks": [
        {**ev.verify["v", "p"]["checks"][0], "outputs": grads}]}
    ev.time["bwd", "p"] = {**ev.time["v", "p"], "measurement": measurement(30e-6, 3e-7)}
    fig = figures.draw_timing(ev, ["p"])
    titles = sorted(ax.get_title() for ax in fig.axes)
    assert titles == ["computing dq, dk, dv", "computing out"]
    forward = next(ax for ax in fig.axes if ax.get_title() == "computing out")
    assert sorted(t.get_text() for t in forward.get_legend().get_texts()) == ["baseline: b", "v"]
    assert all(ax.get_ylabel().startswith("median time per call (µs)") for ax in fig.axes)
    fig.canvas.draw()
    labels = [t.get_text() for ax in fig.axes
              for t in [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)]]
    assert any(labels) and not [t for t in labels if "times" in t or "^" in t]


def test_the_timing_figure_says_what_does_not_fit_and_keeps_a_slot_for_an_untimed_point():
    """A baseline that ran out of the device's memory is a result: the figure says so
    where its bar would be, in the panel where it is timed elsewhere; a point with no time
    record keeps its slot and says it has none."""
    from casebook.report import figures

    ev = evidence(interpret=False, gpus=[H200], kernel_s=1e-3, baseline_s=2e-3)
    ev.spec = {"points": [{"name": "p"}, {"name": "big"}]}
    ev.verify["v", "big"] = ev.verify["v", "p"]
    ev.baselines["b", "big"] = {"timed": False, "execution": ev.baselines["b", "p"]["execution"],
                                "role": "without_work", "not_timed_reason":
                                "does not fit in the device's memory: RESOURCE_EXHAUSTED"}
    fig = figures.draw_timing(ev, ["p", "big"])
    (ax,) = fig.axes
    said = {t.get_text() for t in ax.texts}
    assert said == {"b: does not fit in memory"}
    assert ax.get_xlim()[1] > 1  # the second point's slot is drawn
    del ev.baselines["b", "big"]
    fig = figures.draw_timing(ev, ["p", "big"])
    assert {t.get_text() for t in fig.axes[0].texts} == {"no time record"}


def test_a_tpu_hosts_records_name_the_chip_not_the_host_cpu(tmp_path, monkeypatch):
    """The third TPU window's index cell read "upstream verified (XLA on the host CPU) on
    unknown CPU (13 cores), no GPU": a TPU host's records name its chip, and what ran
    there is a TPU kernel measured by device time."""
    from casebook.report import figures

    monkeypatch.chdir(tmp_path)
    ev = evidence(interpret=False, gpus=[], kernel_s=1e-3, baseline_s=1.4e-3)
    ev.target = "tpu-v5e"
    ev.host["tpus"] = [{"name": "TPU v5 lite"}]
    on_chip = {"mode": "Pallas Mosaic TPU kernel", "interpret": False, "device": "tpu"}
    ev.verify["v", "p"]["checks"][0]["execution"] = on_chip
    ev.time["v", "p"]["execution"] = on_chip
    assert status.hardware(ev) == "TPU v5 lite"
    assert ev.subjects(list(ev.ran.values())) == ["TPU kernel"]
    said = texts(ev)
    assert said[:2] == ["verified (TPU kernel) on TPU v5 lite", "measured on TPU v5 lite"]
    assert not [t for t in said if "host CPU" in t or "no GPU" in t]
    label = figures.face_label(ev, list(ev.ran.values()))
    assert label == "TPU-V5E (TPU v5 lite) · TPU kernel · on the TPU (device time)"
