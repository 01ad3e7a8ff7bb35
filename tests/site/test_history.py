"""Results across commits: the store, the comparison of two revisions and its gate, the
same-binary rule, steps on the pages; across real commits of this repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from casebook.core import paths, records
from casebook.core.errors import CasebookError
from casebook.measure import stats
from casebook.report import history, page_tables
from tests import projects

pytestmark = pytest.mark.timeout(600)
BASE, NEW = "a" * 40, "b" * 40
FLOOR = 0.01


def record(commit: str, seconds: list[float], tmp: Path, binary: str | None = None,
           variant: str = "mgpu", kind: str = "time") -> dict:
    """A timed record of ``kind`` as the time stage writes it, its samples file beside."""
    base = f"results/cpu/splash_attention/{kind}/{variant}/p1"
    table = tmp / f"{base}.samples.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text("sample,seconds,discarded\n" + "".join(
        f"{i},{s!r},False\n" for i, s in enumerate(seconds)) + "99,1.0,True\n")
    subject = {"variant": variant} if kind == "time" else {"baseline": variant}
    return {"kind": kind, "commit": commit, "created_at": "2026-12-05T00:00:00+00:00",
            "target": "cpu", "case": "splash_attention", "point": "p1", "timed": True,
            "sources_sha256": "c" * 64, "execution": {"mode": "jitted XLA on the CPU"},
            **subject,
            "measurement": {"samples_file": f"{base}.samples.csv", "clock_kind": "host",
                            "median_s": float(np.median(seconds)),
                            "ci_low_s": min(seconds), "ci_high_s": max(seconds),
                            "floor_applied": FLOOR, "binary_sha256": binary}}


def samples(median: float, rng: np.random.Generator, n: int = 200) -> list[float]:
    """Fresh draws around ``median`` with 0.2% noise: a floor of 1% tells 5% apart."""
    return [float(s) for s in median * (1 + 0.002 * rng.standard_normal(n))]


def keep_pair(tmp: Path, rng, base_s: float, new_s: float, binaries=(None, None),
              kind: str = "time") -> None:
    for commit, median, binary in ((BASE, base_s, binaries[0]), (NEW, new_s, binaries[1])):
        history.keep(record(commit, samples(median, rng), tmp, binary, kind=kind), root=tmp)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_timed_record_is_kept_with_its_kept_samples(store, rng):
    seconds = samples(1e-3, rng, 20)
    path = history.keep(record(BASE, seconds, store), root=store)
    entry = records.read(path, "history")
    assert path.endswith(f"history/{BASE}/splash_attention/time/mgpu/p1.json")
    assert entry["samples_s"] == seconds  # the discarded sample left out
    assert entry["measured_commit"] == BASE and entry["noise_floor"] == FLOOR


def test_nothing_is_kept_untimed_or_without_a_revision(store, rng):
    untimed = {**record(BASE, samples(1e-3, rng), store), "timed": False}
    assert history.keep(untimed, root=store) is None
    unknown = record("unknown (not a git checkout)", samples(1e-3, rng), store)
    assert history.keep(unknown, root=store) is None
    assert not (store / "results/cpu/history").exists()


@pytest.mark.parametrize(("new_s", "verdict", "code"), [
    (1.05e-3, stats.SLOWER, history.EXIT_SLOWER),
    (0.95e-3, stats.FASTER, 0),
    (1.0e-3, stats.SAME, 0),
])
def test_compare_judges_each_figure_against_the_floor_and_gates_on_slower(
        store, rng, capsys, new_s, verdict, code):
    keep_pair(store, rng, 1e-3, new_s)
    assert history.main(["compare", BASE[:8], NEW[:8], "--json"]) == code
    (change,) = json.loads(capsys.readouterr().out)
    assert change["finding"] == change["verdict"] == verdict
    assert change["same_binary"] is None and change["noise_floor"] == FLOOR


def test_the_same_binary_judged_other_than_same_is_a_miscalibrated_floor(store, rng, capsys):
    """Same binary, 5% slower: not a change (the gate stays open), a floor to recalibrate."""
    keep_pair(store, rng, 1e-3, 1.05e-3, binaries=("d" * 64, "d" * 64))
    assert history.main(["compare", BASE, NEW]) == 0
    out = capsys.readouterr().out
    assert f"{history.MISCALIBRATED} (same binary)" in out
    assert "the noise floor is miscalibrated, not a change" in out


def test_another_binary_slower_fails_the_gate(store, rng, capsys):
    keep_pair(store, rng, 1e-3, 1.05e-3, binaries=("d" * 64, "e" * 64))
    assert history.main(["compare", BASE, NEW]) == history.EXIT_SLOWER
    assert "SLOWER (other binary)" in capsys.readouterr().out


def test_unknown_revisions_and_nothing_shared_are_errors(store, rng, capsys):
    keep_pair(store, rng, 1e-3, 1e-3)
    assert history.main(["compare", BASE, "f" * 40]) == history.EXIT_ERROR
    assert "no such revision in the store" in capsys.readouterr().err
    history.keep(record("9" * 40, samples(1e-3, rng), store, variant="other"), root=store)
    assert history.main(["compare", BASE, "9" * 40]) == history.EXIT_ERROR
    assert "no figure was measured at both" in capsys.readouterr().err


def test_a_corrupt_or_misfiled_entry_names_its_file_and_key(store, rng):
    keep_pair(store, rng, 1e-3, 1e-3)
    path = store / paths.history_entry("cpu", NEW, "splash_attention", "time/mgpu/p1")
    entry = json.loads(path.read_text())
    misfiled = store / paths.history_entry("cpu", "1" * 40, "splash_attention",
                                           "time/mgpu/p1")
    misfiled.parent.mkdir(parents=True)
    misfiled.write_text(path.read_text())
    with pytest.raises(CasebookError, match=r"measured_commit.*filed under revision"):
        history.entries("cpu")
    shutil.rmtree(store / "results/cpu/history" / ("1" * 40))
    path.write_text(json.dumps({**entry, "samples_s": [1e-3, -1.0, 1e-3, 1e-3, 1e-3]}))
    with pytest.raises(CasebookError, match=r"samples_s\.1"):
        history.entries("cpu")


def test_steps_mark_a_change_between_binaries_and_the_page_shows_them(store, rng):
    """Three revisions in order: a 10% step down (other binary), then the same binary
    again; the page's table marks the step, and the slower revision as a failure."""
    revisions = ["1" * 40, "2" * 40, "3" * 40]
    for commit, median, binary in zip(revisions, (1e-3, 1.1e-3, 1.1e-3),
                                      ("d" * 64, "e" * 64, "e" * 64), strict=True):
        history.keep(record(commit, samples(median, rng), store, binary), root=store)
    (series,) = history.steps("cpu", "splash_attention").values()
    findings = [item["change"].finding if item["change"] else None for item in series]
    assert findings[:2] == [None, stats.SLOWER] and findings[2] in (
        stats.SAME, history.MISCALIBRATED)
    assert [history.is_step(item["change"]) for item in series] == [False, True, False]
    html = page_tables.across_commits(history.steps("cpu", "splash_attention"))
    assert html.count(">STEP<") == 1 and "SLOWER" in html and 'class="data row1 col0 fail"' \
        in html.replace("  ", " ")


REAL_BASE, REAL_NEW = ("b0d9d3239796d12a0ba3dc9c0af8ca64b94ec138",
                       "988ebe6625d8f7ca0645137d295aa875709ded32")


def test_the_committed_h200_store_is_what_its_committed_records_give(store):
    """The H200 store holds the device records of two real commits, kept from the
    records committed at them (the windows before the store existed): importing those
    revisions again gives the same entries."""
    for revision in ("a2eb5f6", "339cb69"):
        assert history.import_revision(revision)
    committed = paths.SOURCE_ROOT / paths.history_dir("h200")
    made = sorted(p.relative_to(store / paths.history_dir("h200"))
                  for p in (store / paths.history_dir("h200")).rglob("*.json"))
    assert made == sorted(p.relative_to(committed) for p in committed.rglob("*.json"))
    for rel in made:
        ours, theirs = (json.loads((root / rel).read_text()) for root in (
            store / paths.history_dir("h200"), committed))
        assert {k: v for k, v in ours.items() if k not in ("created_at", "commit")} == \
            {k: v for k, v in theirs.items() if k not in ("created_at", "commit")}


def test_compare_across_two_real_commits_of_the_device_store(monkeypatch, capsys):
    """The committed H200 store: XLA's ragged dot and cuDNN attention were timed at both
    b0d9d32 and 988ebe6; the comparison judges each against the H200's 1% floor."""
    monkeypatch.chdir(paths.SOURCE_ROOT)
    assert history.main(["compare", REAL_BASE[:7], REAL_NEW[:7], "--target", "h200",
                         "--json"]) == 0
    changes = {c["figure"]: c for c in json.loads(capsys.readouterr().out)}
    assert set(changes) == {
        "grouped_gemm_fp8_bf16/baseline/xla_ragged_dot_bf16/ex69_defaults",
        "splash_attention/baseline/cudnn_dot_product_attention/mha_causal_f16"}
    for c in changes.values():
        assert c["noise_floor"] > 0 and c["speedup_ci_low"] <= c["speedup"] <= \
            c["speedup_ci_high"] and c["same_binary"] is None


# Run in a worktree of this repository: the time stage of one jitted baseline on the CPU,
# its noise floor first; prints the history entry the time job kept. The measurement is
# the workflow tests' (tests/projects.MEASUREMENT over the defaults): the real protocol at
# a size a loaded CI host finishes well inside the timeout (the defaults' 20-round floor
# ran past 480 s beside a CPU burner).
MEASURE_IN_WORKTREE = """
import json, sys
from casebook.core import config, paths
from casebook.stages import timing
case, baseline, point = sys.argv[1:4]
defaults, tiny = config.measurement_defaults(), json.loads(sys.argv[4])
measurement = {**defaults, **tiny,
               "noise_floor": {**defaults["noise_floor"], **tiny["noise_floor"]}}
floor = paths.noise_floor_record("cpu")
timing.noise_floor("cpu", measurement, floor)
out = paths.baseline_record("cpu", case, baseline, point)
record = timing.time_baseline("configs/cases", case, baseline, point, "cpu", measurement,
                              floor, out, paths.samples_table(out))
assert record["timed"], record
print(paths.history_entry("cpu", record["commit"], case, f"baseline/{baseline}/{point}"))
"""


def git(*args: str, cwd: Path = paths.SOURCE_ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_two_real_commits_of_one_binary_are_judged_by_the_same_binary_rule(
        tmp_path, monkeypatch, capsys):
    """HEAD, and a commit made on it that changes nothing: each measured in its own
    worktree by the time stage, each keeping its entry; the two name the same binary, so
    any verdict but SAME is reported as a miscalibrated floor and the gate stays open."""
    head = git("rev-parse", "HEAD")
    trees = {"base": tmp_path / "base", "new": tmp_path / "new"}
    try:
        for tree in trees.values():
            git("worktree", "add", "--detach", "--quiet", str(tree), head)
        git("-c", "user.name=casebook test", "-c", "user.email=test@casebook.invalid",
            "commit", "--allow-empty", "--quiet", "-m", "An empty commit: the same binary",
            cwd=trees["new"])
        kept = {}
        for name, tree in trees.items():
            done = subprocess.run(
                [sys.executable, "-c", MEASURE_IN_WORKTREE, "splash_attention",
                 "xla_dot_product_attention", "mha_causal_f16",
                 json.dumps(projects.MEASUREMENT)], cwd=tree, text=True,
                capture_output=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(tree), os.environ.get("PYTHONPATH")]))},
                timeout=480)
            assert done.returncode == 0, done.stderr[-3000:]
            kept[name] = tree / done.stdout.strip().splitlines()[-1]
        store = tmp_path / "store"
        for name, entry in kept.items():
            target = store / entry.relative_to(trees[name])
            target.parent.mkdir(parents=True)
            shutil.copy(entry, target)
        new = git("rev-parse", "HEAD", cwd=trees["new"])
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(paths.SOURCE_ROOT), "worktree", "remove",
                            "--force", str(tree)], capture_output=True, check=False)
    assert new != head and git("cat-file", "-t", new) == "commit"
    monkeypatch.chdir(store)
    assert history.main(["compare", head, new, "--json"]) == 0
    (change,) = json.loads(capsys.readouterr().out)
    assert change["same_binary"] is True
    assert change["finding"] in (stats.SAME, history.MISCALIBRATED)
    assert (change["finding"] == stats.SAME) == (change["verdict"] == stats.SAME)
