"""Every config error stops Snakemake before any job runs, in one line on stderr naming the
file and the key, with a non-zero exit: under ``snakemake -n``, a real run, and a run of
one case. Snakemake runs in a copy of the sources (``tests.projects``) on tiny cases."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from casebook.core import paths
from tests.projects import make_project, tiny_case, tiny_moe_case

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
# Snakemake's own notices (not errors): --configfile or --config given; the profile read.
NOTICES = ("is extended by additional config specified via the command line.",
           "Using workflow specific profile profiles/default for setting default command")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    grouped = yaml.safe_load(
        (paths.SOURCE_ROOT / "configs/cases/grouped_gemm_fp8_bf16.yaml").read_text())
    return make_project(tmp_path_factory.mktemp("config_errors"), tiny_case(),
                        tiny_moe_case(), grouped)


def snakemake(project: Path, *args: str, configfiles: tuple[Path, ...] = ()):
    tiny = project.parent / "tiny.yaml"
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args, "--configfile", str(tiny),
         *map(str, configfiles)],  # --configfile last: it takes every name after it
        cwd=project, capture_output=True, text=True, timeout=300)


@contextlib.contextmanager
def case_edited(project: Path, case: str, change=None, text: str | None = None):
    """The case file in the project's case folder, edited inside the block."""
    path = project.parent / "cases" / f"{case}.yaml"
    before = path.read_text()
    if change is not None:
        data = yaml.safe_load(before)
        change(data)
        text = yaml.safe_dump(data)
    path.write_text(text)
    try:
        yield path
    finally:
        path.write_text(before)


def the_error(done: subprocess.CompletedProcess) -> str:
    """The one line the run printed, having failed before any job; Snakemake's own
    notices aside, nothing else on stderr, no job on stdout."""
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()
             and not any(notice in line for notice in NOTICES)]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("casebook: error: "), done.stderr
    assert "rule " not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert "WorkflowError" not in done.stdout + done.stderr
    return lines[0]


# The same error under a dry run, a real run, and a real run of one case.
RUNS = [("--dry-run",), (), ("splash_attention",)]


def test_the_tiny_project_plans(project):
    done = snakemake(project, "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]


def with_backward_without_dq(case: dict) -> None:
    case["variants"].append({"name": "mgpu_bwd", "description": "The port's backward."})
    # One tolerance per output, dq's left out (the shipped config has one for all).
    case["tolerances"]["float16"] = {name: dict(case["tolerances"]["float16"])
                                     for name in ("out", "dk", "dv")}


@pytest.mark.parametrize("args", RUNS, ids=["dry_run", "run", "one_case"])
def test_a_missing_tolerance_of_an_output(project, args):
    with case_edited(project, "splash_attention", with_backward_without_dq) as path:
        line = the_error(snakemake(project, *args))
    assert line == (f"casebook: error: {path}: tolerances.float16.dq: missing: variant "
                    "mgpu_bwd returns 'dq' at float16 points (e.g. mha_causal_f16)")
    assert not (project / "results").exists()  # no job ran


def test_grouped_gemm_n_not_a_multiple_of_16(project):
    with case_edited(project, "grouped_gemm_fp8_bf16",
                     lambda d: d["points"][1]["params"].update(n=100)) as path:
        line = the_error(snakemake(project, "--dry-run"))
    assert line == (f"casebook: error: {path}: points.1.params.n: 100 must be a multiple of "
                    "16 (16-byte TMA alignment of fp8 rows)")


def test_splash_heads_kv_3(project):
    with case_edited(project, "splash_attention",
                     lambda d: d["points"][0]["params"].update(heads_q=2, heads_kv=3)) as path:
        line = the_error(snakemake(project, "--dry-run"))
    assert line.startswith(f"casebook: error: {path}: points.0.params.heads_kv: 3 does not "
                           f"divide heads_q=2")


def test_a_case_file_that_is_not_yaml(project):
    with case_edited(project, "moe_nvfp4", text="name: moe_nvfp4\ntitle: [open\n") as path:
        line = the_error(snakemake(project, "--dry-run"))
    assert line == (f"casebook: error: {path}:3:1: not valid YAML: expected ',' or ']', but "
                    "got '<stream end>'")


@pytest.mark.parametrize("args", RUNS, ids=["dry_run", "run", "one_case"])
def test_a_bad_key_in_a_configfile_names_that_file_alone(project, tmp_path, args):
    bad = tmp_path / "bad.yaml"
    bad.write_text("measurement:\n  min_samples: 1\n")
    line = the_error(snakemake(project, *args, configfiles=(bad,)))
    assert line == (f"casebook: error: {bad}: measurement.min_samples: 1 is less than the "
                    "minimum of 5")


def test_a_bad_key_on_the_command_line_names_config_alone(project):
    line = the_error(snakemake(project, "--dry-run", "--config", "colour=red"))
    assert line == "casebook: error: --config: colour: unknown key"


def test_a_bad_key_in_the_configfile_is_not_blamed_on_config(project, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("colour: red\n")
    line = the_error(snakemake(project, "--dry-run", "--config", "fail_on_failures=False",
                               configfiles=(bad,)))
    assert line == f"casebook: error: {bad}: colour: unknown key"
