"""How a run ends: one line naming failed verifications and refused measurements."""

from __future__ import annotations

import pytest

from casebook import paths, verdict

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
    }
    monkeypatch.setattr(verdict, "_read", lambda path, kind: made.get(path))


def test_failures_and_refusals_are_named_and_nothing_else(found_records):
    found = verdict.findings({"c": SPEC}, ["cpu"])
    assert found == {"failed": ["cpu/c/k/p1"], "refused": ["cpu/c/baseline xla/p2"]}
    assert verdict.summary(found) == (
        "casebook: 1 point(s) failed verification: cpu/c/k/p1; 1 measurement(s) refused by "
        "a guard: cpu/c/baseline xla/p2 (the site shows them)")


def test_the_run_fails_only_when_asked_to(found_records, capsys):
    with pytest.raises(SystemExit) as ended:
        verdict.finish({"c": SPEC}, ["cpu"], fail=True)
    assert ended.value.code == 1
    verdict.finish({"c": SPEC}, ["cpu"], fail=False)  # the line, but exit 0
    assert capsys.readouterr().err.count("casebook: 1 point(s) failed") == 2


def test_a_refusal_alone_is_named_but_does_not_fail_the_run(monkeypatch, capsys):
    monkeypatch.setattr(verdict, "_read", lambda path, kind: {
        "timed": False, "not_timed_reason": "not measurable: reused"} if kind == "time"
        else None)
    verdict.finish({"c": SPEC}, ["cpu"], fail=True)
    assert "2 measurement(s) refused by a guard" in capsys.readouterr().err


def test_a_clean_run_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(verdict, "_read", lambda path, kind: None)
    verdict.finish({"c": SPEC}, ["cpu"], fail=True)
    assert verdict.summary({"failed": [], "refused": []}) is None
    assert capsys.readouterr().err == ""
