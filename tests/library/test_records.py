"""The schema gate: records are written whole and read back only when they fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from casebook.core import errors, files, records
from casebook.core.errors import CasebookError

CONDITIONS = {k: ["a fact"] for k in ("reference", "hardware_software", "correctness",
                                      "measurement", "baseline", "reproduction")}


def figure_body() -> dict:
    return {"case": "splash_attention", "target": "cpu", "figure": "timing", "title": "t",
            "caption": "c", "svg": "timing.svg", "conditions": dict(CONDITIONS),
            "sources": ["results/cpu/env.json"]}


def test_round_trip_stamps_every_record(tmp_path):
    path = tmp_path / "fig.json"
    written = records.write(path, "figure", figure_body())
    assert records.read(path, "figure") == written
    assert written["schema_version"] == records.SCHEMA_VERSION
    assert {"created_at", "commit"} <= written.keys()
    assert [p.name for p in tmp_path.iterdir()] == ["fig.json"]  # no temporary left


@pytest.mark.parametrize("missing", sorted(CONDITIONS))
def test_sidecar_missing_a_condition_is_refused_naming_file_and_field(tmp_path, missing):
    path = tmp_path / "fig.json"
    records.write(path, "figure", figure_body())
    data = json.loads(path.read_text())
    del data["conditions"][missing]
    path.write_text(json.dumps(data))
    with pytest.raises(CasebookError) as caught:
        records.read(path, "figure")
    assert str(path) in str(caught.value)
    assert f"conditions.{missing}" in str(caught.value)


def test_an_empty_condition_is_refused(tmp_path):
    body = figure_body()
    body["conditions"]["baseline"] = []
    with pytest.raises(CasebookError, match=r"conditions\.baseline"):
        records.write(tmp_path / "fig.json", "figure", body)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_truncated_record_is_refused(tmp_path):
    path = tmp_path / "fig.json"
    records.write(path, "figure", figure_body())
    path.write_text(path.read_text()[:40])
    with pytest.raises(CasebookError, match="corrupt or truncated") as refused:
        records.read(path, "figure")
    # The error says what to do, with the exact commands.
    assert f"to make it again: rm {path} && snakemake --cores all" in str(refused.value)
    assert f"git checkout -- {path}" in str(refused.value)


@pytest.mark.parametrize("version", [0, 2, None])
def test_other_schema_versions_are_refused(tmp_path, version):
    path = tmp_path / "fig.json"
    records.write(path, "figure", figure_body())
    data = json.loads(path.read_text())
    data["schema_version"] = version
    path.write_text(json.dumps(data))
    with pytest.raises(CasebookError, match="schema_version"):
        records.read(path, "figure")


def test_wrong_kind_and_missing_file_are_refused(tmp_path):
    path = tmp_path / "fig.json"
    records.write(path, "figure", figure_body())
    with pytest.raises(CasebookError, match="kind"):
        records.read(path, "verify")
    with pytest.raises(CasebookError, match="missing verify record"):
        records.read(tmp_path / "absent.json", "verify")


def test_a_passing_verify_record_cannot_carry_failures(tmp_path):
    body = {"target": "cpu", "case": "c", "variant": "v", "point": "p", "params": {},
            "sources_sha256": "0" * 64, "oracle": "o",
            "tolerance": {"atol": 0, "rtol": 0, "reason": "r"}, "seed": 1, "trials": 1,
            "ran": True, "checks": [{"purpose": "check", "trial": 0, "passed": True}],
            "races_found": False, "max_abs_error": 0.0, "worst_error_over_tolerance": 0.0,
            "passed": True, "failures": ["a failure"]}
    with pytest.raises(CasebookError, match="failures"):
        records.write(tmp_path / "v.json", "verify", body)
    body["failures"] = []
    records.write(tmp_path / "v.json", "verify", body)


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "f.txt"
    files.atomic_write_text(path, "old")
    with pytest.raises(UnicodeEncodeError):  # fails mid-write: a lone surrogate
        files.atomic_write_text(path, "new \ud800")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_job_whose_run_is_gone_writes_nothing(tmp_path, monkeypatch):
    """A killed run's job still computing when its run dies never renames a record in."""
    path = tmp_path / "f.txt"
    files.atomic_write_text(path, "old")
    monkeypatch.setenv(errors.RUN_PID, str(os.getpid()))  # its run alive: it writes
    files.atomic_write_text(path, "new")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    monkeypatch.setenv(errors.RUN_PID, str(ended.pid))
    with pytest.raises(SystemExit, match="run is gone"):
        files.atomic_write_text(path, "after the run")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def randomized_body() -> dict:
    return {"case": "splash_attention", "runner": "benchmarks/fuzz_mgpu.py",
            "execution": "interpreter", "seed": 7, "examples": 3, "failed": 0, "races": 0,
            "worst_error_over_tolerance": {"out": 0.2, "lse": None},
            "per_variant": {"mgpu": {"examples": 3, "failed": 0,
                                     "worst_error_over_tolerance": {"out": 0.2}}},
            "runs": [{"mask": "causal"}]}


def test_a_randomized_check_record_round_trips_and_shows_on_the_page(tmp_path):
    from casebook.report import conditions

    path = tmp_path / "fuzz.json"
    records.write(path, "randomized_check", randomized_body())
    record = records.read(path, "randomized_check")
    line = conditions.randomized_line({"record": "benchmarks/results/fuzz.json",
                                       "description": "a fuzz", **record})
    assert "3 random problems, 0 failed" in line and "mgpu (3 draws, 0 failed): out 0.2×" in line


@pytest.mark.parametrize("missing", ["examples", "per_variant", "worst_error_over_tolerance"])
def test_a_randomized_check_without_its_counts_is_refused(tmp_path, missing):
    path = tmp_path / "fuzz.json"
    records.write(path, "randomized_check", randomized_body())
    data = json.loads(path.read_text())
    del data[missing]
    path.write_text(json.dumps(data))
    with pytest.raises(CasebookError, match=missing):
        records.read(path, "randomized_check")
