"""How a run ends: one line naming failed verifications and refused measurements."""

from __future__ import annotations

import pytest

from casebook.core import paths
from casebook.report import verdict

SPEC = {"points": [{"name": "p1"}, {"name": "p2"}], "variants": [{"name": "k"}],
        "baselines": [{"name": "xla"}]}


@pytest.fixture
def found_records(monkeypatch):
    """Records as the run left them: k failed at p1 and did not run at p2; a guard
    refused the baseline at p2; everything else passed or was timed."""
    made = {
        paths.verify_record("cpu", "c", "k", "p1"): {"ran": True, "passed": False},
        paths.verify_record("cpu", "c", "k", "p2"): {"ran": False, "passed": False},
        paths.time_record("cpu", "c", "k", "p1"): {
            "timed": False, "not_timed_reason": "verification failed: trial 0"},
        paths.baseline_record("cpu", "c", "xla", "p1"): {"timed": True},
        paths.baseline_record("cpu", "c", "xla", "p2"): {
            "timed": False, "not_timed_reason": "not measurable: the result was reused"},
        paths.compare_record("cpu", "c", "p1"): {
            "measured": False, "not_measured_reason": "not measurable: a stream unseen"},
        paths.compare_record("cpu", "c", "p2"): {"measured": False},  # nothing comparable
    }
    monkeypatch.setattr(verdict, "_read", lambda path, kind: made.get(path))


def test_failures_and_refusals_are_named_and_nothing_else(found_records):
    found = verdict.findings({"c": SPEC}, ["cpu"])
    assert found == {"failed": ["cpu/c/k/p1"],
                     "refused": ["cpu/c/compare/p1", "cpu/c/baseline xla/p2"], "pages": []}
    assert verdict.summary(found) == (
        "casebook: 1 point(s) failed verification: cpu/c/k/p1; 2 measurement(s) refused by "
        "a guard: cpu/c/compare/p1, cpu/c/baseline xla/p2 (the site shows them)")


def test_the_run_fails_only_when_asked_to(found_records, capsys):
    with pytest.raises(SystemExit) as ended:
        verdict.finish({"c": SPEC}, ["cpu"], fail=True)
    assert ended.value.code == 1
    verdict.finish({"c": SPEC}, ["cpu"], fail=False)  # the line, but exit 0
    assert capsys.readouterr().err.count("casebook: 1 point(s) failed") == 2


def test_a_refusal_alone_fails_the_run_like_a_failed_verification(monkeypatch, capsys):
    monkeypatch.setattr(verdict, "_read", lambda path, kind: {
        "timed": False, "not_timed_reason": "not measurable: reused"} if kind == "time"
        else None)
    with pytest.raises(SystemExit) as ended:
        verdict.finish({"c": SPEC}, ["cpu"], fail=True)
    assert ended.value.code == 1
    verdict.finish({"c": SPEC}, ["cpu"], fail=False)  # the line, but exit 0
    err = capsys.readouterr().err
    assert err.count("casebook: 2 measurement(s) refused by a guard") == 2
    assert "failed verification" not in err


def test_a_clean_run_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(verdict, "_read", lambda path, kind: None)
    verdict.finish({"c": SPEC}, ["cpu"], fail=True)
    assert verdict.summary({"failed": [], "refused": [], "pages": []}) is None
    assert capsys.readouterr().err == ""


def test_a_page_that_failed_to_render_fails_the_run_whatever_the_switch(monkeypatch, capsys):
    error = "results/figures/c/cpu/timing.json: conditions.baseline: required key is missing"
    monkeypatch.setattr(verdict, "_read", lambda path, kind: {
        "ok": False, "error": error} if path == paths.page_status("c") else None)
    assert verdict.findings({"c": SPEC, "d": SPEC}, ["cpu"])["pages"] == [f"c ({error})"]
    for fail in (True, False):
        with pytest.raises(SystemExit) as ended:
            verdict.finish({"c": SPEC}, ["cpu"], fail=fail)
        assert ended.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"casebook: 1 page(s) failed to render: c ({error}) (the site shows them)"] * 2
