"""The check's power: near-miss mutants through verify's own check, the bias bisection,
and what a figure says about it (caught, or WEAK naming the mutant let through)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from casebook.core import cases, config, paths, records
from casebook.core.errors import CasebookError
from casebook.report import conditions
from casebook.stages import check_power
from kernels.mutants import Mutant, bias, biased, scale

pytestmark = [pytest.mark.timeout(300), pytest.mark.host_rehearsal]
LOOSE = {"atol": 1e-3, "rtol": 1e-3, "reason": "loose enough for the test"}
SPEC = {"tolerances": {"float32": {"y": LOOSE}}, "verify": {"trials": 2}}
PARAMS = {"dtype": "float32", "n": 64}


def toy(mutants, correct=lambda inputs: 2 * inputs["x"]) -> SimpleNamespace:
    """A case whose oracle answers y = 2x, the correct kernel writes ``correct``."""
    return SimpleNamespace(
        make_inputs=lambda params, rng: {"x": rng.standard_normal(params["n"])},
        oracle=lambda params, inputs: {"y": 2 * inputs["x"]},
        model_outputs=lambda params, inputs, want: {"y": correct(inputs)},
        mutants=lambda params: mutants)


def shifted(amount):
    return lambda params, inputs, want, got: got + amount


def test_smallest_bias_brackets_the_threshold_of_a_monotone_check():
    found = check_power.smallest_bias(lambda f: f > 3e-3)
    assert 3e-3 < found <= 3e-3 * 1.01
    assert check_power.smallest_bias(lambda f: False) is None
    assert check_power.smallest_bias(lambda f: True) == check_power.BIAS_RANGE[0]


def test_bias_is_relative_to_the_outputs_rms_and_keeps_its_dtype(rng):
    values = rng.standard_normal(1000).astype(np.float32)
    values[3] = np.nan  # NaN rows (never computed) do not set the scale and stay NaN
    moved = biased(values, 0.01)
    assert moved.dtype == np.float32 and np.isnan(moved[3])
    assert np.nanmax(np.abs(moved - values - 0.01 * scale(values))) < 1e-6


def test_a_caught_a_missed_and_an_inapplicable_mutant_are_each_recorded():
    mutants = [bias("y", 0.1),
               Mutant("tiny", "y", "off by far less than the tolerance", shifted(1e-7)),
               Mutant("never", "y", "applies nowhere", lambda *args: None)]
    found = check_power.measure(toy(mutants), PARAMS, SPEC, "toy.yaml")
    rows = {r["name"]: r for r in found["mutants"]}
    assert rows["bias_10pct"]["caught"] and len(rows["bias_10pct"]["trials"]) == 2
    assert not rows["tiny"]["caught"] and rows["tiny"]["applicable"]
    assert not rows["never"]["applicable"] and rows["never"]["trials"] == []
    assert rows["bias_10pct"]["caught_poisoned"] and not rows["tiny"]["caught_poisoned"]
    assert (found["caught"], found["applicable"], found["missed"]) == (1, 2, ["y:tiny"])
    assert found["controls"]["y"]["passed"]
    # atol 1e-3 + rtol 1e-3·|y| with |y| ~ 2: a bias is seen from about 1e-3 on.
    assert 2e-4 < found["smallest_bias_detected"]["y"] < 3e-3


def test_a_mutant_that_passes_in_one_trial_is_not_caught():
    draws = iter([0.1, 0.0])  # caught in the first trial only
    flaky = Mutant("flaky", "y", "wrong in one draw", lambda p, i, w, got: got + next(draws))
    found = check_power.measure(toy([flaky]), PARAMS, SPEC, "toy.yaml")
    assert found["missed"] == ["y:flaky"]
    assert [t["passed"] for t in found["mutants"][0]["trials"]] == [False, True]


def test_a_correct_output_that_fails_its_own_check_makes_the_power_weak():
    found = check_power.measure(toy([bias("y", 0.1)], correct=lambda x: 2 * x["x"] + 1),
                                PARAMS, SPEC, "toy.yaml")
    assert not found["controls"]["y"]["passed"]
    power = check_power.power(found, {"y"})
    assert power["weak"] and not power["controls_passed"]


def test_power_counts_only_the_outputs_a_figure_shows_and_words_it():
    record = {"mutants": [
        {"name": "a", "output": "y", "applicable": True, "caught": True},
        {"name": "b", "output": "z", "applicable": True, "caught": False},
        {"name": "c", "output": "y", "applicable": False, "caught": False}],
        "controls": {"y": {"passed": True}, "z": {"passed": True}},
        "smallest_bias_detected": {"y": 2e-3, "z": None}}
    strong = check_power.power(record, {"y"})
    assert (strong["caught"], strong["applicable"], strong["weak"]) == (1, 1, False)
    assert conditions.power_text(strong).startswith("check power: 1/1 mutants caught")
    weak = check_power.power(record, {"y", "z"})
    assert weak["weak"] and weak["missed"] == ["z:b"]
    text = conditions.power_text(weak)
    assert "WEAK" in text and "lets z:b pass" in text and "z none up to 100%" in text
    assert "WEAK" in conditions.power_text(None)
    assert check_power.power(record, {"w"})["weak"]  # no mutant covers it


def _measured(case: str, point: str) -> dict:
    spec = config.load_case(paths.SOURCE_ROOT / "configs/cases", case)
    path = config.case_path(paths.SOURCE_ROOT / "configs/cases", case)
    params = config.find(spec["points"], point, path, "points")["params"]
    return check_power.measure(cases.load(case), params, spec, path)


@pytest.mark.parametrize("point", ["epilogue_multichunk", "convert_beta"])
def test_case_03_catches_every_applicable_mutant(point):
    found = _measured("grouped_gemm_fp8_bf16", point)
    assert found["controls"]["out"]["passed"] and found["missed"] == []
    assert found["applicable"] >= 5
    assert found["smallest_bias_detected"]["out"] < 1e-3


def test_case_01_catches_every_mutant_of_every_stage_and_of_the_whole_paths():
    found = _measured("moe_nvfp4", "e2_m128_h256_i256")
    assert all(c["passed"] for c in found["controls"].values())
    rows = {(r["output"], r["name"]): r for r in found["mutants"]}
    for output in ("a1", "a2"):
        assert rows[output, "scale_off_by_one_block"]["caught"]
        assert rows[output, "codes_truncated"]["caught"]
    for key in [("h", "bias_1pct"), ("h", "last_k_tile_dropped"), ("out", "bias_1pct"),
                ("out", "last_k_tile_dropped")]:
        assert rows[key]["caught"], key
    # A row past masked_m is seen only where the outputs were poisoned (the interpreter's
    # check): elsewhere its values are whatever memory held.
    for stage in ("h", "out", "out_fused"):
        row = rows[stage, "row_past_masked_m"]
        assert row["caught_poisoned"] and not row["caught"], stage
    # The whole paths, checked stage by stage through the kernel's own a2 or h, catch a
    # 1% bias and a skipped requantize (kernels/moe_nvfp4/whole_path.py).
    for path in ("out_fused", "out_unfused"):
        for name in ("bias_1pct", "act_not_requantized"):
            assert rows[path, name]["caught"] and rows[path, name]["caught_poisoned"]
        assert found["smallest_bias_detected"][path] < 1e-3
    assert found["missed_poisoned"] == []
    assert set(found["missed"]) == {f"{s}:row_past_masked_m" for s in ("h", "out", "out_fused")}
    assert all(c["passed_poisoned"] for c in found["controls"].values())


def test_a_value_written_past_masked_m_fails_only_a_poisoned_check(rng):
    from kernels.moe_nvfp4 import checks

    want = np.stack([rng.standard_normal((2, 8, 4)), np.full((2, 8, 4), 1e-3)])
    want[:, 1, 5:] = np.nan  # expert 1: masked_m = 5
    got = want[0].copy()
    tolerance = {"atol": 0, "rtol": 2**-8}
    assert checks.compare("h", got, want, tolerance, poisoned=True)["passed"]
    got[1, 6] = 0.5  # written past masked_m
    assert checks.compare("h", got, want, tolerance)["passed"]  # unseen without poison
    found = checks.compare("h", got, want, tolerance, poisoned=True)
    assert not found["passed"] and found["written_past_masked_m"] == 4


def test_the_rule_writes_a_schema_checked_record(tmp_path):
    out = tmp_path / "power.json"
    check_power.run(str(paths.SOURCE_ROOT / "configs/cases"), "grouped_gemm_fp8_bf16",
                    "convert_beta", "cpu", str(out))
    record = records.read(str(out), "check_power")
    assert record["point"] == "convert_beta" and record["trials"] >= 1
    assert "resumed" not in record and not (tmp_path / "power.trials").exists()
    broken = json.loads(out.read_text())
    del broken["mutants"]
    out.write_text(json.dumps(broken))
    with pytest.raises(Exception, match="mutants"):
        records.read(str(out), "check_power")


class Cut(Exception):
    """A job's end before its last trial (an accelerator window's budget)."""


IDENTITY = {"target": "cpu", "case": "toy", "point": "p", "sources_sha256": "a" * 64,
            "trials": 3}


def test_a_job_cut_short_resumes_from_the_trials_it_finished(tmp_path, monkeypatch):
    """Each trial is kept the moment it is made; the next job takes them back with their
    seed, makes only the rest, lists the resumed ones, and ends with the record an uncut
    job of that seed makes. Kept trials of other sources are made again."""
    spec = {**SPEC, "verify": {"trials": 3}}
    mutants = [bias("y", 0.1), Mutant("tiny", "y", "far under the tolerance", shifted(1e-7))]
    drawn = []

    def case(cut_at: int | None):
        made = toy(mutants)
        draw = made.make_inputs

        def counted(params, rng):
            drawn.append(len(drawn))
            if len(drawn) - 1 == cut_at:
                raise Cut
            return draw(params, rng)

        made.make_inputs = counted
        return made

    held = check_power.Held(tmp_path / "p.trials", IDENTITY)
    with pytest.raises(Cut):
        check_power.measure(case(cut_at=2), PARAMS, spec, "toy.yaml", "p", held)
    kept = sorted(p.name for p in held.folder.iterdir())
    assert kept == ["trial-0.json", "trial-1.json"]
    seed = records.read(held.folder / "trial-0.json", "check_power_trial")["seed"]
    drawn.clear()
    resumed = check_power.measure(case(cut_at=None), PARAMS, spec, "toy.yaml", "p", held)
    assert len(drawn) == 1 and resumed["seed"] == seed
    assert [r["trial"] for r in resumed["resumed"]] == [0, 1]
    monkeypatch.setenv("CASEBOOK_SEED", str(seed))
    whole = check_power.measure(toy(mutants), PARAMS, spec, "toy.yaml", "p")
    assert {k: v for k, v in resumed.items() if k != "resumed"} == whole
    assert len(whole["controls"]["y"]["trials"]) == 3 and whole["missed"] == ["y:tiny"]
    other = check_power.Held(held.folder, {**IDENTITY, "sources_sha256": "b" * 64})
    drawn.clear()
    again = check_power.measure(case(cut_at=None), PARAMS, spec, "toy.yaml", "p", other)
    assert len(drawn) == 3 and "resumed" not in again


def test_a_corrupt_kept_trial_is_refused_by_name(tmp_path):
    held = check_power.Held(tmp_path / "p.trials", IDENTITY)
    held.folder.mkdir()
    (held.folder / "trial-0.json").write_text('{"kind": "check_power_trial"')
    with pytest.raises(CasebookError, match=r"trial-0\.json"):
        check_power.measure(toy([bias("y", 0.1)]), PARAMS, SPEC, "toy.yaml", "p", held)


def test_a_point_whose_model_outputs_are_sampled_rows_is_refused_by_name():
    """Past a case's dense oracle the oracle answers some rows only; a case with no whole
    reference to make its model outputs from gives sampled rows there too, and mutants are
    whole outputs, so the stage refuses, naming the case file, the key and the rows,
    instead of failing inside a mutant (splash attention makes them whole: its
    tests/splash_attention/test_splash_near_misses.py)."""
    from kernels import contract

    case = toy([bias("y", 0.1)])
    case.oracle = lambda params, inputs: {"y": contract.SampledRows(
        (params["n"],), (np.arange(4),), lambda: 2 * inputs["x"][:4], seed=1)}
    case.model_outputs = lambda params, inputs, want: want
    with pytest.raises(CasebookError, match=r"toy\.yaml: points: check power needs whole "
                       r"model outputs; at big the case gives sampled rows only: "
                       r"y \(4 of 64 rows\)"):
        check_power.measure(case, PARAMS, SPEC, "toy.yaml", "big")
