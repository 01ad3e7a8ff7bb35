"""Autotune: tile candidates, the pick rule, the tile_choice record and the tile table.

Nothing here measures a GPU: the end-to-end test runs the real measurement engine on
the Mosaic GPU interpreter (a mechanics test; its record says interpret mode), and the
rule itself refuses target cpu.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from casebook.core import cases, config, paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.report import conditions, page_tables, site
from casebook.stages import autotune, build, tile_table, timing, verify
from kernels import contract
from kernels.splash_attention import autotune as candidates_of
from kernels.splash_attention import mgpu_backward, mgpu_forward, port, upstream
from tests.projects import MEASUREMENT, make_project, snakemake, tiny_case
from tests.tile_choices import CASE_PATH, FAKE_FOUND, FAKE_SPEC, fake_plugin, write_choice

LIMIT = 232_448  # Hopper's opt-in shared memory per block
BIG = {"heads_q": 16, "heads_kv": 16, "seq_len": 4096, "head_dim": 256,
       "mask": {"kind": "causal"}, "dtype": "bfloat16"}
TINY = {"heads_q": 1, "heads_kv": 1, "seq_len": 256, "head_dim": 64,
        "mask": {"kind": "causal"}, "dtype": "float16"}


def forward_bytes(d: int, bq: int, bkv: int, stages: int, has_tiles: bool) -> int:
    """The forward's shared memory at head_dim d (bf16, one warpgroup), counted by hand:
    Q, the K^T and V rings, P, a Q barrier and a ring of kv barriers (+ the tile ring)."""
    total = 2 * (bq * d + 2 * stages * bkv * d + bq * bkv) + 8 * (1 + stages)
    return total + (2 * stages * bq * bkv + 8 * stages if has_tiles else 0)


def by_tiles(found: dict, group: str) -> dict[tuple, dict]:
    return {tuple(c["tiles"].values()): c for c in found[group]}


def test_the_smem_filter_keeps_what_fits_the_budget_and_names_what_does_not():
    assert mgpu_forward.SMEM_LIMIT_BYTES == LIMIT
    for variant, has_tiles in (("mgpu", False), ("mgpu_mask_tiles", True)):
        found = candidates_of.tile_candidates(variant, BIG)
        kept, rejected = by_tiles(found, "kept"), by_tiles(found, "rejected")
        assert len(kept) + len(rejected) == 2 * 2 * 4 * 2
        for bq, bkv, stages in ((64, 64, 1), (64, 64, 2), (64, 128, 1), (128, 64, 1)):
            want = forward_bytes(256, bq, bkv, stages, has_tiles)
            assert want <= LIMIT
            assert kept[bq, bkv, stages, 1]["smem_bytes"] == {"forward": want}
        # 64 x 128 with a 2-deep ring: 311,320 B (plus tiles) — over the budget, named.
        over = rejected[64, 128, 2, 1]
        assert over["smem_bytes"]["forward"] == forward_bytes(256, 64, 128, 2, has_tiles) > LIMIT
        assert "over the 232,448-byte limit" in over["reason"]
        assert all(max(c["smem_bytes"].values()) <= LIMIT for c in found["kept"])
    backward = candidates_of.tile_candidates("mgpu_bwd", BIG)
    assert backward["key"] == "bwd_tiles"
    assert [c["tiles"] for c in backward["kept"]] == [{"block_q": 64, "block_kv": 64,
                                                       "stages": 1}]
    deeper = mgpu_backward.smem_bytes(port.problem(BIG), mgpu_backward.BackwardConfig(64, 64, 2),
                                      has_tiles=False)
    assert by_tiles(backward, "rejected")[64, 64, 2]["smem_bytes"] == deeper
    assert max(deeper.values()) > LIMIT


def test_candidates_must_divide_the_sequence_and_pair_two_warpgroups_with_128_rows():
    found = candidates_of.tile_candidates("mgpu", {**TINY, "seq_len": 320})
    rejected = by_tiles(found, "rejected")
    assert "not a multiple of block_q 128" in rejected[128, 64, 1, 1]["reason"]
    assert "not a multiple of block_kv 128" in rejected[64, 128, 1, 1]["reason"]
    assert "need block_q 128" in rejected[64, 64, 1, 2]["reason"]
    assert {tuple(c["tiles"].values()) for c in found["kept"]} == {
        (64, 64, s, 1) for s in (1, 2, 3, 4)}
    with pytest.raises(ValueError, match="no tile choice"):
        candidates_of.tile_candidates("mgpu_no_rescaling", TINY)


def test_upstream_candidates_are_block_sizes_dividing_the_sequence_with_the_default_kept():
    """On a TPU the rule picks upstream's block size: 128 (its default, so the default is
    timed beside the pick), 512 and 1024 where the sequence is a multiple; the pick
    reaches upstream's BlockSizes for that variant only."""
    params = {**TINY, "seq_len": 1536}
    for variant, key in (("upstream", "upstream_blocks"), ("upstream_bwd", "upstream_bwd_blocks")):
        found = candidates_of.tile_candidates(variant, params)
        assert found["key"] == key and found["hand"] == {"block": 128}
        assert [c["tiles"]["block"] for c in found["kept"]] == [128, 512]
        assert [r["tiles"]["block"] for r in found["rejected"]] == [1024]
        assert "not a multiple of block 1024" in found["rejected"][0]["reason"]
    tuned = {**params, "upstream_bwd_blocks": {"block": 512}}
    assert upstream.block_sizes(tuned, "upstream_bwd").block_kv_dq == 512
    assert upstream.block_sizes(tuned, "upstream").block_q == 128
    assert candidates_of.tile_candidates("upstream", {**params, "block": 512})["hand"] == {
        "block": 512}


RULE = candidates_of.TIE_RULE


def timed(stages, wgs, median, half, passed=True):
    return {"tiles": {"stages": stages, "compute_wgs": wgs}, "tie_order": [stages, wgs],
            "verify": {"passed": passed}, "timed": True,
            "measurement": {"median_s": median, "ci_low_s": median - half,
                            "ci_high_s": median + half, "confidence": 0.95}}


def test_a_clear_winner_is_picked_by_its_median(rng):
    fast = rng.uniform(1e-4, 2e-4)
    found = [timed(1, 1, 3 * fast, fast / 10), timed(4, 2, fast, fast / 10)]
    chosen, reason = autotune.pick(found, RULE)
    assert chosen == 1
    assert "overlaps no other" in reason


def test_overlapping_intervals_go_to_fewer_stages_then_fewer_warpgroups(rng):
    base = rng.uniform(1e-4, 2e-4)
    found = [timed(3, 1, base, base / 5), timed(2, 2, base * 1.05, base / 5),
             timed(2, 1, base * 1.1, base / 5), timed(1, 1, base * 2, base / 20)]
    chosen, reason = autotune.pick(found, RULE)
    assert chosen == 2  # tied with the fastest; stages 2 < 3, one warpgroup < two
    assert "2 other(s) within its 95% interval" in reason and "fewer stages" in reason


def test_a_candidate_that_failed_verification_is_never_picked_even_if_fastest(rng):
    base = rng.uniform(1e-4, 2e-4)
    found = [timed(1, 1, base / 10, base / 100, passed=False), timed(2, 1, base, base / 10)]
    assert autotune.pick(found, RULE)[0] == 1
    assert autotune.pick(found[:1], RULE)[0] is None


def test_every_candidate_failing_verification_gives_no_pick_and_no_table_row(
        tmp_path, monkeypatch):
    """The record says why nothing was picked; the table lists the point as unpicked (it
    runs the kernel's own choice) and keeps the other points' picks."""
    out = str(tmp_path / "tiles/v/p.json")
    autotune.choose(fake_plugin(wrong={1, 2}), FAKE_SPEC, CASE_PATH,
                    "v", "p", "h200", MEASUREMENT, FAKE_FOUND, out, str(tmp_path / "s"))
    record = records.read(out, "tile_choice")
    assert record["pick"] is None and record["pick_is_hand"] is None
    assert "no candidate both passed verification" in record["reason"]
    assert [c["timed"] for c in record["candidates"]] == [False, False]
    assert not any(c["verify"]["passed"] for c in record["candidates"])
    picked = str(tmp_path / "tiles/v/q.json")
    spec = {**FAKE_SPEC, "points": [*FAKE_SPEC["points"], {**FAKE_SPEC["points"][0],
                                                            "name": "q"}]}
    autotune.choose(fake_plugin(wrong=set()), spec, CASE_PATH, "v", "q", "h200",
                    MEASUREMENT, FAKE_FOUND, picked, str(tmp_path / "s2"))
    monkeypatch.chdir(tmp_path)
    made = tile_table.generate("h200", "splash_attention", [out, picked], "tiles.yaml")
    assert list(made["rows"]["v"]) == ["q"]
    assert made["unpicked"]["v"]["p"].startswith(f"{out}: no candidate both passed")
    assert config.read_yaml(Path("tiles.yaml")) == made  # generate validated it first


class Cut(BaseException):
    """The window's end, arriving while a candidate is measured."""


def test_a_choice_cut_short_resumes_from_the_candidates_it_finished(tmp_path):
    """Each candidate is kept as a tile_candidate record when made; the next job measures
    only the rest, lists the resumed ones, widens every interval to the floor for the
    pick, and leaves no candidate folder. A kept candidate of other settings is redone."""
    out = str(tmp_path / "tiles/v/p.json")
    calls = []

    def plugin(cut_at: int | None):
        made = fake_plugin(wrong=set())
        kernel = made.kernel

        def counted(variant, params, purpose, build_dir=None):
            calls.append(params["tiles"]["w"])
            if params["tiles"]["w"] == cut_at:
                raise Cut
            return kernel(variant, params, purpose)

        made.kernel = counted
        return made

    with pytest.raises(Cut):
        autotune.choose(plugin(cut_at=2), FAKE_SPEC, CASE_PATH, "v", "p", "h200",
                        MEASUREMENT, FAKE_FOUND, out, str(tmp_path / "s"))
    kept = tmp_path / "tiles/v/p.candidates"
    assert sorted(p.name for p in kept.iterdir()) == ["w1.json", "w1.samples.csv"]
    assert records.read(kept / "w1.json", "tile_candidate")["candidate"]["timed"]
    calls.clear()
    floor = 0.5  # wide enough to tie the two: the tie goes to w1
    record = autotune.choose(plugin(cut_at=None), FAKE_SPEC, CASE_PATH, "v", "p", "h200",
                             MEASUREMENT, FAKE_FOUND, out, str(tmp_path / "s"), floor)
    assert calls == [2]
    assert [r["tiles"] for r in record["resumed"]] == [{"w": 1}]
    assert record["floor_applied"] == floor and record["pick"] == {"tiles": {"w": 1}}
    assert not kept.exists()
    for entry in record["candidates"]:  # the samples moved beside the record
        assert Path(entry["measurement"]["samples_file"]).parent == tmp_path / "s"
        assert Path(entry["measurement"]["samples_file"]).is_file()
    records.read(out, "tile_choice")

    with pytest.raises(Cut):
        autotune.choose(plugin(cut_at=2), FAKE_SPEC, CASE_PATH, "v", "p", "h200",
                        MEASUREMENT, FAKE_FOUND, out, str(tmp_path / "s"))
    calls.clear()
    other = {**MEASUREMENT, "warmup_calls": MEASUREMENT["warmup_calls"] + 1}
    record = autotune.choose(plugin(cut_at=None), FAKE_SPEC, CASE_PATH, "v", "p", "h200",
                             other, FAKE_FOUND, out, str(tmp_path / "s"), floor)
    assert calls == [1, 2] and "resumed" not in record


def test_a_gpu_target_refuses_a_runnable_that_would_run_in_an_interpreter(tmp_path):
    plugin = fake_plugin(wrong=set())
    interpreted = plugin.kernel

    def kernel(variant, params, purpose, build_dir=None):
        return interpreted(variant, params, purpose)._replace(execution=contract.execution(
            "interpreter", interpret=True, poisoned=True))

    plugin.kernel = kernel
    with pytest.raises(CasebookError, match="interpreter on target h200"):
        autotune.choose(plugin, FAKE_SPEC, CASE_PATH, "v", "p", "h200",
                        MEASUREMENT, FAKE_FOUND, str(tmp_path / "p.json"), str(tmp_path / "s"))


def test_run_refuses_target_cpu(tmp_path):
    with pytest.raises(CasebookError, match="target: autotune measures tile candidates on an "
                                            "accelerator"):
        autotune.run("configs/cases", "splash_attention", "mgpu", "mha_causal_f16", "cpu",
                     MEASUREMENT, str(tmp_path / "p.json"), str(tmp_path / "s"),
                     str(tmp_path / "noise_floor.json"))


@pytest.mark.interpret
@pytest.mark.timeout(900)
def test_interpret_mode_autotune_writes_a_schema_valid_tile_choice(tmp_path):
    """Mechanics on the CPU: two candidates of a tiny point, each verified against the
    float64 oracle in the Mosaic GPU interpreter and timed by the real engine there."""
    spec = config.load_case("configs/cases", "splash_attention")
    spec["points"] = [{"name": "tiny_causal_f16", "params": TINY}]
    space = {"block_q": (64,), "block_kv": (64, 128), "stages": (1,), "compute_wgs": (1,)}
    found = candidates_of.tile_candidates("mgpu", TINY, space)
    assert len(found["kept"]) == 2
    out = str(tmp_path / "tiles/mgpu/tiny_causal_f16.json")
    autotune.choose(cases.load("splash_attention"), spec,
                    config.case_path("configs/cases", "splash_attention"), "mgpu",
                    "tiny_causal_f16", "cpu", MEASUREMENT, found, out, str(tmp_path / "samples"))
    record = records.read(out, "tile_choice")  # read back through the schema
    assert record["target"] == "cpu" and record["key"] == "tiles"
    # The hand choice: the budget rule's tiles (64, 128, 2 stages, one warpgroup).
    assert record["hand"] == {"block_q": 64, "block_kv": 128, "stages": 2, "compute_wgs": 1}
    assert record["pick_is_hand"] == (record["pick"]["tiles"] == record["hand"])
    for candidate in record["candidates"]:
        assert candidate["execution"]["interpret"] is True
        assert "interpret mode" in candidate["execution"]["mode"]
        assert candidate["verify"]["passed"] and candidate["verify"]["nan_count"] == 0
        assert candidate["timed"], candidate.get("not_timed_reason")
        assert Path(candidate["measurement"]["samples_file"]).exists()
    assert record["pick"]["tiles"] in [c["tiles"] for c in found["kept"]]
    print({json.dumps(c["tiles"]): c["measurement"]["median_s"] for c in record["candidates"]},
          record["reason"])
    page = page_tables.tile_choices(SimpleNamespace(
        target="cpu", case="splash_attention",
        tile_choices={("mgpu", "tiny_causal_f16"): record}), href=lambda path: None)
    assert page.count("PICKED: fastest median") == 1 and page.count("passed (") == 2
    assert "FAILED" not in page
    with pytest.raises(CasebookError, match="target"):  # no tile table for target cpu
        tile_table.generate("cpu", "splash_attention", [out], str(tmp_path / "tiles.yaml"))


def test_the_tuned_choice_sets_tiles_unless_the_config_gives_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # results/ is relative to the working directory
    spec = config.load_case("configs/cases", "splash_attention")
    point = next(p for p in spec["points"] if "tiles" not in p["params"])
    params = point["params"]
    tuned_tiles = {"block_q": 64, "block_kv": 64, "stages": 1, "compute_wgs": 1}
    assert port.tuning(params) != mgpu_forward.TuningConfig(**tuned_tiles)  # the budget rule
    assert tile_table.apply("h200", "splash_attention", "mgpu", point["name"], params) == (
        params, None)  # no choice yet
    choice = write_choice("mgpu", point["name"], params, tuned_tiles)

    tuned, used = tile_table.apply("h200", "splash_attention", "mgpu", point["name"], params)
    assert port.tuning(tuned) == mgpu_forward.TuningConfig(**tuned_tiles)
    assert used["applied"] and used["sha256"] == provenance.file_sha256(choice)
    assert used["file"] == paths.tile_choice_record("h200", "splash_attention", "mgpu",
                                                    point["name"]) == str(choice)
    assert tile_table.apply("cpu", "splash_attention", "mgpu", point["name"], params)[1] is None
    assert tile_table.apply("h200", "splash_attention", "mgpu_bwd", point["name"],
                            params)[1] is None  # no choice for the backward
    other = next(p for p in spec["points"] if p["name"] != point["name"])
    assert tile_table.apply("h200", "splash_attention", "mgpu", other["name"],
                            other["params"])[1] is None  # nor at another point

    explicit = {**params, "tiles": {"block_q": 128, "block_kv": 64, "stages": 2,
                                    "compute_wgs": 1}}
    kept, used = tile_table.apply("h200", "splash_attention", "mgpu", point["name"], explicit)
    assert port.tuning(kept) == mgpu_forward.TuningConfig(128, 64, 2, 1)
    assert not used["applied"] and "case config gives `tiles`" in used["why"]

    with pytest.raises(CasebookError, match=r"\.json: params: tuned for other"):
        tile_table.apply("h200", "splash_attention", "mgpu", point["name"],
                         {**params, "seq_len": params["seq_len"] * 2})
    write_choice("mgpu", point["name"], params, None)  # every candidate failed
    assert tile_table.apply("h200", "splash_attention", "mgpu", point["name"], params) == (
        params, None)


def test_a_foreign_or_corrupt_choice_names_the_file_and_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    choice = write_choice("mgpu", "p", TINY, {"block_q": 64})
    made = json.loads(choice.read_text())
    for field, value in (("target", "cpu"), ("variant", "mgpu_bwd"), ("point", "q")):
        choice.write_text(json.dumps({**made, field: value}))
        with pytest.raises(CasebookError, match=rf"p\.json: {field}: is '{value}'"):
            tile_table.apply("h200", "splash_attention", "mgpu", "p", TINY)
    choice.write_text(json.dumps(made)[:-40])
    with pytest.raises(CasebookError, match=r"p\.json: corrupt or truncated JSON"):
        tile_table.apply("h200", "splash_attention", "mgpu", "p", TINY)


@pytest.mark.e2e
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_autotune_rule_refuses_cpu_and_stays_out_of_all(tmp_path):
    case = tiny_case()  # autotunes mgpu
    project = make_project(tmp_path, case)
    refused = snakemake(project, "--dry-run", "autotune")
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert said.count("casebook: autotune measures tile candidates on an accelerator; "
                      "target cpu") == 1
    everything = snakemake(project, "--dry-run")
    assert everything.returncode == 0, everything.stderr[-2000:]
    jobs = [line.split()[0] for line in everything.stdout.splitlines() if line.strip()]
    assert "tile_choice" not in jobs and "tile_table" not in jobs and "autotune" not in jobs
    assert "verify" in jobs  # the job-count table lists the jobs of `all`
    gpu = snakemake(project, "--dry-run", "--config", "target=h200", "--", "autotune")
    assert gpu.returncode == 0, gpu.stderr[-2000:]
    assert "gpu=1, constraint=h200" in gpu.stdout
    assert "results/h200/splash_attention/tiles/mgpu/mha_causal_f16.json" in gpu.stdout
    assert gpu.stdout.count("rule tile_choice:") == 1  # one variant at one point


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_job_depends_on_its_own_points_tile_choice_alone(tmp_path, monkeypatch):
    """A point's verify job reads that point's tile_choice record where one exists, and no
    other point's: a choice remade reruns its point's jobs alone, and a point without one
    schedules no autotune."""
    case = tiny_case()
    full = yaml.safe_load((paths.SOURCE_ROOT / "configs/cases/splash_attention.yaml")
                          .read_text())
    second = next(p for p in full["points"] if p["name"] != case["points"][0]["name"])
    case["points"].append({**second, "params": {**second["params"], "heads_q": 1,
                                                 "heads_kv": 1}})
    project = make_project(tmp_path, case)
    tuned, other = (p["name"] for p in case["points"])
    monkeypatch.chdir(project)
    write_choice("mgpu", tuned, case["points"][0]["params"], {"block_q": 64, "block_kv": 64,
                                                             "stages": 1, "compute_wgs": 1})
    planned = snakemake(project, "--dry-run", "--config", "target=h200", "--",
                        *(paths.verify_record("h200", "splash_attention", "mgpu", p)
                          for p in (tuned, other)))
    assert planned.returncode == 0, planned.stderr[-2000:]
    jobs = planned.stdout.split("\nrule ")
    verify = {p: next(j for j in jobs if j.startswith("verify:") and f"/{p}.json" in
                      j.split("output:")[1].splitlines()[0]) for p in (tuned, other)}
    choice = paths.tile_choice_record("h200", "splash_attention", "mgpu", tuned)
    assert choice in verify[tuned].split("output:")[0]
    assert "/tiles/" not in verify[other].split("output:")[0]
    # the untuned point gets no autotune (the tuned one's is remade here only because
    # this bare project has no env, host and floor records of h200 yet)
    assert paths.tile_choice_record("h200", "splash_attention", "mgpu", other) not in (
        planned.stdout)


def test_the_page_says_where_tiles_came_from():
    spec = config.load_case("configs/cases", "splash_attention")
    untuned = SimpleNamespace(target="h200", case="splash_attention", tile_choices={})
    assert "not autotuned (no autotune run on it yet)" in site.tile_note(spec, untuned)
    unpicked = SimpleNamespace(**{**vars(untuned), "tile_choices": {("mgpu", "p"): {
        "pick": None}}})
    assert "no candidate passed verification and was timed" in site.tile_note(spec, unpicked)
    picked = SimpleNamespace(**{**vars(untuned), "tile_choices": {
        ("mgpu", "p"): {"pick": None}, ("mgpu", "q"): {"pick": {"tiles": {"block_q": 64}}}}})
    assert "else the pick of the point's own autotune" in site.tile_note(spec, picked)
    assert site.tile_note({k: v for k, v in spec.items() if k != "autotune"}, untuned) is None


@pytest.mark.interpret
@pytest.mark.compile
@pytest.mark.timeout(600)
def test_build_and_verify_run_the_tuned_row_and_record_its_choice(tmp_path, monkeypatch):
    """On a target with a tile choice at the point, its tiles reach the kernel (the lowered
    launch shows them) and the build, verify and time records name the tile_choice record
    and its sha256; a time stage refuses a verify record made with another choice."""
    case = tiny_case()
    case["build_only_points"] = []
    case["points"][0]["params"].pop("tiles", None)  # the choice's row, not the config's
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases/splash_attention.yaml").write_text(yaml.safe_dump(case))
    monkeypatch.chdir(tmp_path)
    point = case["points"][0]
    params = config.load_case(tmp_path / "cases", "splash_attention")["points"][0]["params"]
    tuned_tiles = {"block_q": 64, "block_kv": 64, "stages": 1, "compute_wgs": 1}
    assert port.tuning(params) != mgpu_forward.TuningConfig(**tuned_tiles)
    choice = write_choice("mgpu", point["name"], params, tuned_tiles)

    lowered = build.lower(str(tmp_path / "cases"), "splash_attention", "mgpu",
                          point["name"], "h200", "lowered.json")
    built = build.gather(str(tmp_path / "cases"), "splash_attention", "mgpu", "h200",
                         ["lowered.json"], "build.json")
    (entry,) = built["points"]
    assert entry == lowered["built"]
    (artifact,) = entry["artifacts"]
    assert artifact["facts"]["tuning"] == {"block_q": 64, "block_kv": 64, "stages": 1,
                                           "compute_warpgroups": 1}
    assert entry["tile_table"]["sha256"] == provenance.file_sha256(choice)
    checked = verify.run(str(tmp_path / "cases"), "splash_attention", "mgpu", point["name"],
                         "h200", "verify.json")
    assert checked["passed"], checked["failures"]
    assert checked["tile_table"] == entry["tile_table"]
    assert checked["tile_table"]["applied"] and checked["tile_table"]["tuned"] == tuned_tiles
    floor = write_floor("floor.json")
    timed = timing.time_kernel(str(tmp_path / "cases"), "splash_attention", "mgpu",
                               point["name"], "h200", MEASUREMENT, "verify.json", "floor.json",
                               "time.json", "time.samples.csv")
    assert timed["timed"] and timed["tile_table"] == entry["tile_table"]
    m = timed["measurement"]  # the interval holds where a rerun lands on this host
    assert m["floor_applied"] == floor["noise_floor"] and m["interval"] == "run-to-run"
    assert m["ci_low_s"] <= m["median_s"] / 1.25 and m["ci_high_s"] >= m["median_s"] * 1.25
    made = json.loads(choice.read_text())
    choice.write_text(json.dumps({**made, "pick": {"tiles": {**tuned_tiles, "stages": 2}}}))
    with pytest.raises(CasebookError, match=r"verify\.json: tile_table: verified with another"):
        timing.time_kernel(str(tmp_path / "cases"), "splash_attention", "mgpu",
                           point["name"], "h200", MEASUREMENT, "verify.json", "floor.json",
                           "time.json", "time.samples.csv")


def write_floor(path: str) -> dict:
    """An h200 noise-floor record (25% run to run, 1% paired)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return records.write(path, "noise_floor", {
        "target": "h200", "workload": "test", "stop_criterion": "fixed_count",
        "stop_target": 0.01, "rounds": 4, "quantile": 0.95, "ratios": [1.0, 1.1, 0.9, 1.0],
        "median_s": 1e-3, "noise_floor": 0.25, "clock": "host", "clock_kind": "host",
        "cache": {"mode": "hot", "description": "test"}, "repeats": 1, "pinned_cpu": None,
        "paired": {"rounds": 4, "quantile": 0.95, "ratios": [1.0, 1.01, 0.99, 1.0],
                   "median_s": 1e-3, "samples_per_series": 10, "noise_floor": 0.01}})


def test_the_reproduction_condition_names_the_tile_choices_the_timed_kernels_used():
    spec = config.load_case("configs/cases", "splash_attention")
    used = {"file": "results/h200/splash_attention/tiles/mgpu/p.json", "sha256": "ab" * 32,
            "row": "mgpu.p", "key": "tiles", "tuned": {"block_q": 64}, "applied": True}
    ev = SimpleNamespace(spec=spec, time={("mgpu", "p"): {"tile_table": used},
                                          ("upstream", "p"): {}})
    assert conditions._tiles(ev) == [
        "Tiles: autotuned per point where a point's config gives none (tile_choice records: "
        "results/h200/splash_attention/tiles/mgpu/p.json)"]
    ev.time[("mgpu", "q")] = {"tile_table": {**used, "file": used["file"].replace("p.", "q.")}}
    assert "(tile_choice records: 2 under results/h200/splash_attention/tiles/mgpu/)" in (
        conditions._tiles(ev)[0])
    for timed in ev.time.values():
        timed.pop("tile_table", None)
    assert "not autotuned" in conditions._tiles(ev)[0]
