"""Bad configuration: one error naming the file and the key."""

from __future__ import annotations

import shutil

import pytest
import yaml

from casebook import config, paths
from casebook.errors import CasebookError

CASE = "splash_attention"


@pytest.fixture
def case_dir(tmp_path):
    shutil.copy(paths.SOURCE_ROOT / "configs" / "cases" / f"{CASE}.yaml", tmp_path)
    return tmp_path


def edit(case_dir, change):
    path = case_dir / f"{CASE}.yaml"
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_case_loads_with_defaults(case_dir):
    spec = config.load_case(case_dir, CASE)
    assert all(p["params"]["block"] == 128 for p in spec["points"])


@pytest.mark.parametrize(("change", "key", "message"), [
    (lambda d: d.update(colour="red"), "colour", "unknown key"),
    (lambda d: d["reference"].pop("repository"), "reference.repository", "required"),
    (lambda d: d["verify"].update(trials="two"), "verify.trials", "not of type"),
    (lambda d: d["points"][0]["params"].update(heads_q="x"), "points.0.params.heads_q",
     "not of type"),
    (lambda d: d["points"][1]["params"].update(extra=1), "points.1.params.extra", "unknown"),
    (lambda d: d["points"][0]["params"]["mask"].update(kind="local"),
     "points.0.params.mask.window", "required"),
    (lambda d: d["tolerances"].pop("bfloat16"), "points.1.params.dtype", "no tolerance"),
    (lambda d: d["tolerances"]["float32"].update(reason="short"), "tolerances.float32.reason",
     "too short"),
    (lambda d: d["tolerances"].update(float32={"out": {"atol": 0, "rtol": 0}}),
     "tolerances.float32.out.reason", "required"),
    (lambda d: d["tolerances"].update(float32={"Out": dict(d["tolerances"]["float16"])}),
     "tolerances.float32", "does not match"),
    (lambda d: d["baselines"].append(dict(d["baselines"][0])), "baselines", "appears twice"),
    (lambda d: d.update(name="other"), "name", "file is"),
])
def test_bad_case_config_names_file_and_key(case_dir, change, key, message):
    path = edit(case_dir, change)
    with pytest.raises(CasebookError) as caught:
        config.load_case(case_dir, CASE)
    assert caught.value.path == str(path)
    assert caught.value.key == key
    assert message in caught.value.message


def test_per_output_tolerances_load(case_dir):
    exact = {"atol": 0, "rtol": 0, "reason": "bit-exact by construction"}
    one = {"atol": 1e-3, "rtol": 1e-3, "reason": "one tolerance for every output"}
    edit(case_dir, lambda d: d["tolerances"].update(float32={"out": exact, "lse": exact},
                                                     float16=one))
    spec = config.load_case(case_dir, CASE)
    assert config.tolerance(spec, "float32", "lse", "f") == exact
    assert config.tolerance(spec, "float16", "lse", "f") == one


def test_unknown_case_lists_the_known_ones(case_dir):
    with pytest.raises(CasebookError, match=r"unknown case 'nope' \(known: splash_attention\)"):
        config.load_case(case_dir, "nope")


def test_broken_yaml_is_refused(case_dir):
    (case_dir / f"{CASE}.yaml").write_text("name: [unclosed\n")
    with pytest.raises(CasebookError, match="not valid YAML"):
        config.load_case(case_dir, CASE)


@pytest.mark.parametrize(("data", "key"), [
    ({"cases": ["a"], "colour": 1}, "colour"),
    ({"cases": "a"}, "cases"),
    ({}, "cases"),
    ({"cases": ["a"], "target": "tpu"}, "target"),
    ({"cases": ["a"], "measurement": {"min_samples": 1}}, "measurement.min_samples"),
])
def test_bad_global_config_names_the_key(data, key):
    with pytest.raises(CasebookError) as caught:
        config.validate("configs/config.yaml", data, paths.CONFIG_SCHEMA)
    assert caught.value.key == key


def test_global_config_defaults_are_filled():
    data = {"cases": ["a"]}
    config.validate("c.yaml", data, paths.CONFIG_SCHEMA)
    assert data["target"] == "auto"
    assert data["measurement"]["warmup_calls"] >= 1


def test_shipped_global_config_is_valid():
    data = yaml.safe_load((paths.SOURCE_ROOT / "configs" / "config.yaml").read_text())
    config.validate("configs/config.yaml", data, paths.CONFIG_SCHEMA)
