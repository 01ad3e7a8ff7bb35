"""The flake hunt (benchmarks/flake_hunt.py): a test whose outcome varies between runs is
named with its messages; one that always fails is named apart; the burner spins."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import flake_hunt

TESTS = '''
from pathlib import Path

def test_steady():
    pass

def test_every_other_run():
    seen = Path("count")
    n = int(seen.read_text()) if seen.exists() else 0
    seen.write_text(str(n + 1))
    assert n % 2 == 0, f"odd run {n}"

def test_broken():
    assert False, "always"
'''


def committed(tree, tests: str) -> str:
    """``tests`` committed in a fresh repository at ``tree``: its commit."""
    (tree / "test_sample.py").write_text(tests)
    for args in (["init", "-q"], ["add", "test_sample.py"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tests"]):
        subprocess.run(["git", *args], cwd=tree, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_hunt_names_the_tests_that_varied_and_those_that_always_failed(tmp_path):
    commit = committed(tmp_path, TESTS)
    found = flake_hunt.hunt(3, 1, sys.executable, tmp_path, {"PYTHONDONTWRITEBYTECODE": "1"},
                            ["test_sample.py"], tmp_path / "logs")
    flaky = "test_sample::test_every_other_run"
    assert found["varied"] == {flaky: {"passed": 2, "failed": 1}}
    assert found["always_failed"] == ["test_sample::test_broken"]
    assert found["failure_messages"][flaky] == ["AssertionError: odd run 1"]
    assert [r["passed"] for r in found["per_run"]] == [2, 1, 2]
    assert all(r["exit_status"] == 1 and r["peak_rss_gib"] > 0 for r in found["per_run"])
    assert len(list((tmp_path / "logs").glob("run*.log"))) == 3 and found["burner_processes"] == 1
    assert found["tested_commit"] == commit


def test_a_hunt_whose_tree_changed_under_it_writes_no_record(tmp_path):
    committed(tmp_path, "from pathlib import Path\n\ndef test_edits():\n"
                        "    Path('test_sample.py').write_text('# edited')\n")
    with pytest.raises(SystemExit, match="the tree changed during the hunt"):
        flake_hunt.hunt(1, 0, sys.executable, tmp_path, {"PYTHONDONTWRITEBYTECODE": "1"},
                        ["test_sample.py"], tmp_path / "logs")
