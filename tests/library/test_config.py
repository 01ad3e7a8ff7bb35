"""Bad configuration: one error naming the file and the key."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from casebook.core import config, paths, provenance
from casebook.core.errors import CasebookError
from casebook.stages import point_job, timing
from kernels.contract import Runnable

CASE = "splash_attention"
CASES = ("splash_attention", "moe_nvfp4", "grouped_gemm_fp8_bf16")


@pytest.fixture
def case_dir(tmp_path):
    for case in CASES:
        shutil.copy(paths.SOURCE_ROOT / "configs" / "cases" / f"{case}.yaml", tmp_path)
    return tmp_path


def edit(case_dir, change, case=CASE):
    path = case_dir / f"{case}.yaml"
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


# What only the case's kernel package knows, refused when the config loads (before any
# job runs): its check of the point parameters (build-only points too), a tolerance for
# every output each variant and baseline returns, and the names of both.
@pytest.mark.parametrize(("case", "change", "key", "message"), [
    ("splash_attention", lambda d: d["tolerances"].update(float16={
        name: dict(d["tolerances"]["float16"]) for name in ("out", "dk", "dv")}),
     "tolerances.float16.dq", "missing: variant mgpu_bwd returns 'dq' at float16 points"),
    ("moe_nvfp4", lambda d: d["tolerances"]["nvfp4"].pop("out_dense"),
     "tolerances.nvfp4.out_dense", "missing: baseline dense_bf16 returns 'out_dense'"),
    ("moe_nvfp4", lambda d: d["tolerances"]["nvfp4"].pop("a2"),
     "tolerances.nvfp4.a2", "missing: variant fused returns 'a2'"),
    ("grouped_gemm_fp8_bf16", lambda d: d["points"][1]["params"].update(n=100),
     "points.1.params.n", "100 must be a multiple of 16"),
    ("grouped_gemm_fp8_bf16", lambda d: d["build_only_points"][2]["params"].update(k=520),
     "build_only_points.2.params.k", "520 must be a multiple of 16"),
    ("splash_attention", lambda d: d["points"][1]["params"].update(heads_kv=3),
     "points.1.params.heads_kv", "3 does not divide heads_q=4"),
    ("splash_attention", lambda d: d["points"][2]["params"].update(seq_len=384, block=256),
     "points.2.params.seq_len", "384 is not a multiple of upstream's block 256 (block)"),
    ("moe_nvfp4", lambda d: d["build_only_points"][0]["params"].update(hidden=7296),
     "build_only_points.0.params.hidden", "7296 is not a multiple of 256"),
    ("moe_nvfp4", lambda d: d["variants"][2].update(name="gemm1_nosuch"),
     "variants.2.name", "unknown moe_nvfp4 variant 'gemm1_nosuch'"),
    ("splash_attention", lambda d: d["baselines"][1].update(name="flash_nosuch"),
     "baselines.1.name", "unknown splash_attention baseline 'flash_nosuch'"),
], ids=["tolerance_of_a_variant_output", "tolerance_of_a_baseline_output",
        "tolerance_of_a_stage", "grouped_n", "grouped_build_only_k", "splash_heads_kv",
        "splash_seq_len", "moe_build_only_hidden", "unknown_variant", "unknown_baseline"])
def test_the_case_plugin_checks_the_config_when_it_loads(case_dir, case, change, key, message):
    path = edit(case_dir, change, case)
    with pytest.raises(CasebookError) as caught:
        config.load_case(case_dir, case)
    assert (caught.value.path, caught.value.key) == (str(path), key)
    assert caught.value.message.startswith(message), caught.value.message
    assert str(caught.value) == f"{path}: {key}: {caught.value.message}"
    assert "\n" not in str(caught.value)


def test_the_shipped_cases_pass_their_plugins_checks():
    for case in CASES:
        config.load_case("configs/cases", case)


def test_the_plugins_answers_are_kept_by_the_hash_of_their_sources(case_dir, tmp_path,
                                                                    monkeypatch):
    """Kept answers are used (a planted one is believed) while the kernel sources hash the
    same, and asked again once they do not."""
    monkeypatch.chdir(tmp_path)
    config.load_case(case_dir, "moe_nvfp4")
    kept = tmp_path / paths.plugin_answers("moe_nvfp4")
    answers = json.loads(kept.read_text())
    assert answers["sources_sha256"] == provenance.kernel_sources_sha256("moe_nvfp4")
    assert answers["answers"]['outputs "moe_fused"'] == ["a1", "a2", "out_fused"]
    answers["answers"]['outputs "moe_fused"'] = ["planted"]
    kept.write_text(json.dumps(answers))
    with pytest.raises(CasebookError, match="variant moe_fused returns 'planted'"):
        config.load_case(case_dir, "moe_nvfp4")
    answers["sources_sha256"] = "0" * 64  # the kernel sources changed since
    kept.write_text(json.dumps(answers))
    config.load_case(case_dir, "moe_nvfp4")
    assert json.loads(kept.read_text())["answers"]['outputs "moe_fused"'] == \
        ["a1", "a2", "out_fused"]
    for broken in ('{"sources_sha2', json.dumps({
            "sources_sha256": provenance.kernel_sources_sha256("moe_nvfp4"), "answers": ["x"]})):
        kept.write_text(broken)  # a cache, not a record: asked again, and kept whole
        config.load_case(case_dir, "moe_nvfp4")
        assert json.loads(kept.read_text())["answers"]['outputs "moe_fused"'] == \
            ["a1", "a2", "out_fused"]


def test_a_config_with_kept_answers_loads_without_jax(case_dir, tmp_path):
    """What Snakemake's process does on every rerun: no kernel package, no jax."""
    script = ("import sys; from casebook.core import config; "
              f"[config.load_case({str(case_dir)!r}, c) for c in {CASES!r}]; "
              "print(sorted(m for m in ('jax', 'kernels.splash_attention', "
              "'kernels.moe_nvfp4', 'kernels.grouped_gemm_fp8_bf16') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(paths.SOURCE_ROOT)}
    imported = [subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
                for _ in range(2)]
    assert imported[0] != "[]"  # first: asked, so imported
    assert imported[1] == "[]"


def test_errors_name_a_file_under_the_current_directory_relative_to_it(case_dir,
                                                                      monkeypatch):
    edit(case_dir, lambda d: d["points"][1]["params"].update(n=100), "grouped_gemm_fp8_bf16")
    monkeypatch.chdir(case_dir.parent)
    with pytest.raises(CasebookError) as caught:
        config.load_case(case_dir, "grouped_gemm_fp8_bf16")  # given absolute
    line = f"{case_dir.name}/grouped_gemm_fp8_bf16.yaml: points.1.params.n: 100 must be a " \
        "multiple of 16 (16-byte TMA alignment of fp8 rows)"
    assert str(caught.value) == line


def test_unknown_case_lists_the_known_ones(case_dir):
    with pytest.raises(CasebookError, match=r"unknown case 'nope' \(known: grouped_gemm_fp8_"
                                            r"bf16, moe_nvfp4, splash_attention\)"):
        config.load_case(case_dir, "nope")


@pytest.mark.parametrize(("text", "where", "problem"), [
    ("name: [unclosed\n", ":2:1", "expected ',' or ']', but got '<stream end>'"),
    ("name: splash_attention\n  title: indented\n", ":2:8",
     "mapping values are not allowed here"),
    ("name: splash_attention\ntitle: 'open\n", ":3:1",
     "found unexpected end of stream"),
    ("name: splash_attention\n\ttitle: tab\n", ":2:1",
     "found character '\\t' that cannot start any token"),
])
def test_broken_yaml_is_one_line_with_line_and_column(case_dir, text, where, problem):
    path = case_dir / f"{CASE}.yaml"
    path.write_text(text)
    with pytest.raises(CasebookError) as caught:
        config.load_case(case_dir, CASE)
    assert str(caught.value) == f"{path}{where}: not valid YAML: {problem}"


def overlay(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_bad_key_names_only_the_overlay_that_set_it(tmp_path):
    good = overlay(tmp_path, "good.yaml", {"target": "cpu", "measurement": {"target": 0.05}})
    bad = overlay(tmp_path, "bad.yaml", {"colour": "red"})
    with pytest.raises(CasebookError) as caught:
        config.load_global([good, bad])
    assert str(caught.value) == f"{bad}: colour: unknown key"


def test_a_nested_key_names_the_file_that_holds_it_not_its_parent(tmp_path):
    bad = overlay(tmp_path, "bad.yaml", {"measurement": {"min_samples": 1}})
    later = overlay(tmp_path, "later.yaml", {"measurement": {"target": 0.05}})
    with pytest.raises(CasebookError) as caught:
        config.load_global([bad, later])
    assert (caught.value.path, caught.value.key) == (str(bad), "measurement.min_samples")
    settings = config.load_global([later])  # merged as Snakemake merges: nested keys kept
    assert settings["measurement"]["target"] == 0.05
    assert settings["measurement"] == {**config.measurement_defaults(), "target": 0.05}
    h100 = overlay(tmp_path, "h100.yaml", {"cluster": {"h100": {"gpus": 2, "constraint": "x"}}})
    shipped = config.load_global()["cluster"]
    assert config.load_global([h100])["cluster"] == {
        **shipped, "h100": {"gpus": 2, "constraint": "x"}}  # configs/config.yaml's others


def test_a_broken_overlay_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases: [a\n")
    with pytest.raises(CasebookError) as caught:
        config.load_global([bad])
    assert re.fullmatch(rf"{re.escape(str(bad))}:2:1: not valid YAML: [^\n]+", str(caught.value))


@pytest.mark.parametrize(("sources", "key", "blamed"), [
    ([("base", {"target": "auto"}), ("--config", {"colour": "red"})], "colour", "--config"),
    ([("base", {"target": "auto"}), ("over", {"target": "tpu"}), ("--config", {"x": 1})],
     "target", "over"),
    ([("base", {"measurement": {"clock": "auto"}}), ("over", {"measurement": {}})],
     "measurement.clock", "base"),
    ([("base", {"cluster": {"cpu": {"gpus": 0}}}), ("over", {"cluster": {"cpu": {}}})],
     "cluster.cpu.constraint", "over"),  # missing: the last that holds its parent
    ([("base", {}), ("over", {})], "cases", "base"),  # missing everywhere: the base
])
def test_the_source_of_a_key_is_the_last_that_holds_it(sources, key, blamed):
    assert config.source_of(sources, key) == blamed


def test_validate_global_blames_only_the_source_of_the_key():
    sources = [("configs/config.yaml", {"cases": ["a"]}), ("over.yaml", {"target": "cpu"}),
               ("--config", {"target": "tpu"})]
    with pytest.raises(CasebookError) as caught:
        config.validate_global({"cases": ["a"], "target": "tpu"}, sources)
    assert str(caught.value).startswith("--config: target: ")


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


def test_host_stand_ins_for_a_kernel_get_the_short_protocol():
    measurement = config.load_global()["measurement"]

    def runnable(interpret: bool, **facts) -> Runnable:
        return Runnable(None, None, None, None, {"interpret": interpret, **facts})

    short = timing.settings_for(runnable(True), measurement)
    full = timing.settings_for(runnable(False), measurement)
    assert full == timing.settings_of(measurement) and full.criterion == "median_precision"
    assert (short.criterion, short.count, short.warmup_calls) == ("fixed_count", 5, 1)
    assert (short.confidence, short.clock) == (full.confidence, full.clock)
    # Case 03's numpy model of the port on the host (not the kernel): the short protocol;
    # XLA on the host CPU is a speed result there: the full one.
    model = point_job.load("configs/cases", "grouped_gemm_fp8_bf16", "cpu", "ex69_defaults",
                       "model")
    timed = model.plugin.kernel("model", model.tuned, "time", build_dir=model.build_dir)
    assert timing.settings_for(timed, measurement) == short
    assert timing.settings_for(runnable(False, device="cpu"), measurement) == full
    # A stand-in is measured hot (measurement.interpret.cache), whatever its case says;
    # anything else in its case's cache state.
    assert [timing.cache_for(r, measurement, "cold") for r in (
        timed, runnable(True), runnable(False, device="cpu"))] == ["hot", "hot", "cold"]
    as_case = {**measurement, "interpret": {"criterion": "fixed_count", "count": 5}}
    assert timing.cache_for(runnable(True), as_case, "cold") == "cold"
    with pytest.raises(CasebookError, match=r"measurement: count=2 must be at least 5"):
        timing.settings_for(runnable(True), {**measurement, "interpret": {
            "criterion": "fixed_count", "count": 2}})


def test_a_job_context_names_an_unknown_variant_or_point_in_the_case_file():
    job = point_job.load("configs/cases", "splash_attention", "cpu", "mha_causal_f16", "mgpu")
    assert (job.plugin.__name__, job.tuned, job.tiles_from) == (
        "kernels.splash_attention", job.params, None)
    assert job.stamp()["sources_sha256"] == provenance.job_sha256(job.spec, "mgpu",
                                                                   "mha_causal_f16")
    for variant, point, key in (("nope", "mha_causal_f16", "variants"),
                                ("mgpu", "nope", "points")):
        with pytest.raises(CasebookError, match=f"splash_attention.yaml: {key}"):
            point_job.load("configs/cases", "splash_attention", "cpu", point, variant)
    build_only = config.load_case("configs/cases", "splash_attention")["build_only_points"]
    with pytest.raises(CasebookError, match="points"):
        point_job.load("configs/cases", "splash_attention", "cpu", build_only[0]["name"], "mgpu")
    assert point_job.load("configs/cases", "splash_attention", "cpu", build_only[0]["name"],
                      "mgpu", build_only_points=True).build_only
