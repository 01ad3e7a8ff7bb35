"""The GPU window: its plan and budgets, steps stopped at their budgets, the archive it
packs, and the import that checks every record before results/<target>/ is replaced."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from casebook.core import config, errors, paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.hosts import archive, carry, gpu_window
from casebook.run import chip_holder, worker
from casebook.stages import envcapture, hostcapture, tile_table
from tests.tile_choices import write_choice

pytestmark = pytest.mark.host_rehearsal

HEAD = subprocess.run(["git", "-C", str(paths.SOURCE_ROOT), "rev-parse", "HEAD"],
                      capture_output=True, text=True, check=True).stdout.strip()


def test_the_plan_fits_one_device_command_and_the_dry_run_prints_it():
    window = gpu_window.load()
    assert window["total_s"] <= 540
    fixed = [s["budget_s"] for s in window["steps"] if s["budget_s"] != "rest"]
    assert sum(fixed) + window["pack_s"] <= window["total_s"]
    done = subprocess.run(["bash", str(paths.SOURCE_ROOT / "benchmarks" / "gpu_run.sh"),
                           "--dry-run", "--target", "h200"], capture_output=True, text=True,
                          env={**os.environ, "CASEBOOK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    assert f"at most {window['total_s']:g} s in all" in done.stdout
    for step in window["steps"]:
        assert step["what"] in done.stdout
    assert "results/h200/grouped_gemm_fp8_bf16/compare/ex69_defaults.json" in done.stdout


def test_a_gpu_tests_step_runs_its_tests_and_the_plan_lists_them(tmp_path):
    window = yaml.safe_load(gpu_window.WINDOW_CONFIG.read_text())
    test = "tests/grouped_gemm_fp8_bf16/test_grouped_gemm_gpu.py"
    window["steps"] = [{"name": "gpu_tests", "case": "grouped_gemm_fp8_bf16", "budget_s": 5,
                        "tests": [test], "what": "x"}]
    path = tmp_path / "gpu-window.yaml"
    path.write_text(yaml.safe_dump(window))
    window = gpu_window.load(path)
    [[argv]] = gpu_window.commands(window, "h200", "o")
    assert argv[1:3] == ["-m", "pytest"] and argv[-1] == test
    assert f"runs: -m pytest {test}" in gpu_window.describe(window, "h200")


def test_the_short_tpu_plan_is_the_tpu_plan_in_less_time():
    full = gpu_window.load(gpu_window.WINDOW_CONFIG.with_name("tpu-window.yaml"))
    short = gpu_window.load(gpu_window.WINDOW_CONFIG.with_name("tpu-window-short.yaml"))
    assert short["total_s"] < full["total_s"]
    assert {**short, "total_s": full["total_s"]} == full


def test_the_short_plan_is_valid_shorter_and_named_by_plan():
    short = gpu_window.load(gpu_window.WINDOW_CONFIG.with_name("gpu-window-short.yaml"))
    assert short["total_s"] < gpu_window.load()["total_s"]
    done = subprocess.run(["bash", str(paths.SOURCE_ROOT / "benchmarks" / "gpu_run.sh"),
                           "--dry-run", "--target", "h200", "--plan",
                           "configs/gpu-window-short.yaml"], capture_output=True, text=True,
                          env={**os.environ, "CASEBOOK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    assert f"at most {short['total_s']:g} s in all" in done.stdout
    assert [s["name"] for s in short["steps"]] == ["records", "measure", "measure"]


def test_budgets_over_the_window_are_refused(tmp_path):
    window = yaml.safe_load(gpu_window.WINDOW_CONFIG.read_text())
    window["steps"][0]["budget_s"] = window["total_s"]
    path = tmp_path / "gpu-window.yaml"
    path.write_text(yaml.safe_dump(window))
    with pytest.raises(CasebookError, match=f"{path}: steps: budgets and pack_s add up"):
        gpu_window.load(path)


def test_a_step_taking_the_rest_leaves_the_later_steps_their_budgets(tmp_path, monkeypatch):
    """``rest``: the time left when the step starts, less the budgets of the numbered
    steps after it; a later ``rest`` step gets what is left after that."""
    monkeypatch.chdir(tmp_path)
    window = copy.deepcopy(gpu_window.load())
    window.update(total_s=9, pack_s=1, steps=[
        {"name": "autotune", "budget_s": "rest", "what": "hangs"},
        {"name": "records", "budget_s": 3, "what": "quick"},
        {"name": "measure", "case": "splash_attention", "budget_s": "rest", "what": "quick"}])
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    quick = [sys.executable, "-c", "print('ok')"]
    monkeypatch.setattr(gpu_window, "commands", lambda w, t, o: [[sleep], [quick], [quick]])
    write_target_records(tmp_path, "h200")
    done = gpu_window.run(window, "h200", tmp_path / "out")
    assert [s["status"] for s in done["steps"]] == ["stopped at its budget", "done", "done"]
    assert 4 <= done["steps"][0]["seconds"] <= 5.5  # 8 s of steps, 3 held back


PLAN_STEP_NAMES = config.read_yaml(gpu_window.WINDOW_SCHEMA)["properties"]["steps"]["items"][
    "properties"]["name"]["enum"]


def test_every_step_a_plan_may_name_gets_a_window_record(tmp_path, monkeypatch):
    """The window record is written after the last step, when the chip's time is spent:
    every step name the plan's schema allows must pass the record's schema (a TPU window
    ran 571 s of check_power and autotune steps, then its record was refused)."""
    monkeypatch.chdir(tmp_path)
    write_target_records(tmp_path, "h200")
    window = copy.deepcopy(gpu_window.load())
    window.update(total_s=60, pack_s=5, steps=[
        {"name": name, "case": "splash_attention", "budget_s": "rest", "what": name}
        for name in PLAN_STEP_NAMES])
    quick = [[sys.executable, "-c", "print('ok')"]]
    monkeypatch.setattr(gpu_window, "commands", lambda w, t, o: [quick] * len(w["steps"]))
    done = gpu_window.run(window, "h200", tmp_path / "out")
    assert [s["name"] for s in done["steps"]] == PLAN_STEP_NAMES
    assert [s["status"] for s in done["steps"]] == ["done"] * len(PLAN_STEP_NAMES)
    records.read(paths.gpu_window_record("h200"), "gpu_window")


def test_a_plan_whose_window_record_would_be_refused_is_refused_before_it_runs(
        tmp_path, monkeypatch):
    refused = records.check

    def old_schema(path, kind, data):  # the records schema as it was before check_power steps
        if kind == "gpu_window" and any(s["name"] == "check_power" for s in data["steps"]):
            raise CasebookError(path, "steps.1.name", "'check_power' is not one of [...]")
        refused(path, kind, data)

    monkeypatch.setattr(records, "check", old_schema)
    path = tmp_path / "plan.yaml"
    plan = config.read_yaml(paths.SOURCE_ROOT / "configs" / "tpu-window.yaml")
    path.write_text(yaml.safe_dump(plan))
    with pytest.raises(CasebookError, match=f"{path}: steps: its window record would be "
                                            "refused: .*'check_power' is not one of"):
        gpu_window.load(path)
    plan["steps"] = [s for s in plan["steps"] if s["name"] != "check_power"]
    path.write_text(yaml.safe_dump(plan))
    gpu_window.load(path)


def test_a_refused_window_record_still_packs_the_chips_records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    window = copy.deepcopy(gpu_window.load())
    window.update(total_s=30, pack_s=5, steps=[
        {"name": "measure", "case": "splash_attention", "budget_s": "rest", "what": "x"}])
    made = "results/h200/case/time/v/p.samples.csv"  # what the step measured
    measure = ("import pathlib; p = pathlib.Path('" + made + "'); "
               "p.parent.mkdir(parents=True); p.write_text('sample,seconds\\n0,1e-3\\n')")
    monkeypatch.setattr(gpu_window, "commands",
                        lambda w, t, o: [[[sys.executable, "-c", measure]]])
    written = records.write

    def refuse(path, kind, body):
        if kind == "gpu_window":
            raise CasebookError(path, "steps.0.name", "refused")
        return written(path, kind, body)

    monkeypatch.setattr(records, "write", refuse)
    with pytest.raises(CasebookError, match=r"steps\.0\.name: refused"):
        gpu_window.run(window, "h200", tmp_path / "out")
    [packed] = (tmp_path / "out").glob("*.tar.xz")
    with tarfile.open(packed) as tar:
        assert made in tar.getnames()


def test_the_dry_run_checks_the_archives_a_window_continues(tmp_path, capsys):
    """An archive the window's host would refuse is refused here, before a device start
    is spent on it (a start was lost to an early archive without env and host records)."""
    good = make_archive(tmp_path)
    assert gpu_window.main(["--dry-run", "--target", "h200", "--continue", str(good)]) == 0
    assert "continues 1 earlier windows' archives of h200 (checked)" in capsys.readouterr().out
    bare = tmp_path / "bare.tar.xz"
    with tarfile.open(bare, "w:xz") as tar:
        tar.add(tmp_path / "source" / "results" / "h200" / "case", arcname="results/h200/case")
    assert gpu_window.main(["--dry-run", "--target", "h200", "--continue", str(good),
                            str(bare)]) == 1
    assert f"{bare}: results/h200/env.json: missing" in capsys.readouterr().err
    assert gpu_window.main(["--dry-run", "--target", "tpu-v5e", "--continue", str(good)]) == 1
    assert "an archive of target h200, not tpu-v5e" in capsys.readouterr().err


def test_a_cpu_host_is_refused_a_gpu_target(capsys):
    assert gpu_window.main(["--target", "h200", "--out", "x"]) == 1
    assert "this host is cpu" in capsys.readouterr().err


def test_each_step_stops_at_its_budget_and_the_window_packs_what_it_has(tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_target_records(tmp_path, "h200", commit="0" * 40)  # an earlier window's
    window = copy.deepcopy(gpu_window.load())
    window["steps"] = [
        {"name": "records", "budget_s": 30, "what": "quick"},
        {"name": "measure", "case": "splash_attention", "budget_s": 1.5, "what": "hangs"},
        {"name": "autotune", "budget_s": 30, "what": "fails"},
    ]
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(gpu_window, "commands", lambda w, t, o: [
        [[sys.executable, "-c", "print('ok')"]], [sleep], [[sys.executable, "-c", "exit(3)"]]])
    start = time.monotonic()
    done = gpu_window.run(window, "h200", tmp_path / "out")
    assert time.monotonic() - start < 60  # the hung step was cut: its sleep alone is 60 s
    assert [s["status"] for s in done["steps"]] == ["done", "stopped at its budget", "failed"]
    assert done["steps"][2]["exit_code"] == 3
    record = records.read(paths.gpu_window_record("h200"), "gpu_window")
    assert record["steps"] == done["steps"]
    assert Path(paths.log("gpu_window", "00_records_")).read_text() == "ok\n"
    with tarfile.open(done["archive"]["file"]) as tar:
        names = tar.getnames()
    assert "results/h200/gpu_window.json" in names
    assert "results/h200/logs/gpu_window/00_records_.log" in names
    assert "results/h200/env.json" not in names  # the earlier window's records are gone


def test_the_window_records_what_its_chip_holders_spent_opening_the_chip(tmp_path,
                                                                         monkeypatch):
    """Each step's holder (casebook/run/chip_holder.py) leaves a report; the window's record
    lists them and the share of its time spent opening the chip. A report left from
    before the window is not counted."""
    monkeypatch.chdir(tmp_path)
    stale = tmp_path / chip_holder.LOG_DIR / "1.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"device_kind": "old", "opened_s": 99.0, "jobs": 1,
                                 "failed": 0, "job_s": 1.0}))
    window = copy.deepcopy(gpu_window.load(gpu_window.WINDOW_CONFIG.with_name("tpu-window.yaml")))
    window["steps"] = [{"name": "records", "budget_s": 30, "what": "one holder"}]
    report = {"pid": 2, "device_kind": "TPU v5 lite", "opened_s": 0.5, "jobs": 3,
              "failed": 1, "job_s": 0.2}
    writes = (f"import json, pathlib, time; p = pathlib.Path({str(chip_holder.LOG_DIR)!r}); "
              f"p.mkdir(parents=True, exist_ok=True); "
              f"(p / '2.json').write_text(json.dumps({report!r})); time.sleep(1)")
    monkeypatch.setattr(gpu_window, "commands", lambda w, t, o: [[[sys.executable, "-c", writes]]])
    monkeypatch.setattr(gpu_window, "_step_holder", lambda step, target: None)
    done = gpu_window.run(window, "tpu-v5e", tmp_path / "out")
    record = records.read(paths.gpu_window_record("tpu-v5e"), "gpu_window")
    assert record["chip_holders"] == [{k: report[k] for k in
                                       ("device_kind", "opened_s", "jobs", "failed", "job_s")}]
    assert record["opening_share"] == pytest.approx(0.5 / done["seconds"], abs=1e-4)
    assert 0 < record["opening_share"] <= 0.5  # the step took at least its 1 s sleep


def test_a_tpu_step_opens_the_chip_once_for_all_its_runs(tmp_path, monkeypatch):
    """On a TPU the window starts one chip holder a step: each of the step's runs finds
    it alive in its environment (so its Snakefile starts none), and it is gone after the
    step. A GPU window's steps, and a TPU window's pytest step, get none."""
    monkeypatch.chdir(tmp_path)
    window = copy.deepcopy(gpu_window.load(gpu_window.WINDOW_CONFIG.with_name("tpu-window.yaml")))
    window["steps"] = [{"name": "measure", "case": "grouped_gemm_fp8_bf16", "budget_s": 120,
                        "what": "two points"},
                       {"name": "gpu_tests", "budget_s": 30, "what": "tests", "tests": ["x"]}]
    seen = tmp_path / "seen.txt"
    says = (f"import os; from casebook.run import chip_holder, worker; "
            f"open({str(seen)!r}, 'a').write(os.environ.get(worker.CHIP_HOLDER_PID, '-') + ' ' "
            f"+ str(chip_holder.inherited()) + '\\n')")
    run = [sys.executable, "-c", says]
    waits = [sys.executable, "-c", f"import os, time; from casebook.run import worker\n"
             f"while not os.path.exists(os.environ[worker.CHIP_SOCKET]): time.sleep(0.1)\n{says}"]
    monkeypatch.setattr(gpu_window, "commands", lambda w, t, o: [[waits, run], [run]])
    done = gpu_window.run(window, "tpu-v5e", tmp_path / "out")
    first, second, tests = seen.read_text().splitlines()
    assert first == second and first.endswith(" True") and tests == "- False"
    holder = int(first.split()[0])
    assert errors.gone(holder)
    assert [held["jobs"] for held in done["chip_holders"]] == [0]  # opened once, ran none
    assert worker.CHIP_SOCKET not in os.environ
    seen.unlink()
    monkeypatch.setattr(gpu_window, "commands", lambda w, t, o: [[run, run], [run]])
    gpu_window.run(window, "h200", tmp_path / "out")
    assert seen.read_text().splitlines() == ["- False"] * 3


def test_a_continuing_window_starts_from_the_earlier_windows_archive(tmp_path, monkeypatch):
    """A plan too long for one device command continues in the next (``--continue A``):
    the earlier window's archive, of this commit, is put in place with its records dated
    before the window (Snakemake skips their jobs), the records step is skipped, and the
    archive holds the plan so far; an archive of another commit is refused."""
    monkeypatch.chdir(tmp_path)
    window = copy.deepcopy(gpu_window.load())
    window["steps"] = [{"name": "records", "budget_s": 30, "what": "env, host, floor"},
                       {"name": "measure", "case": "splash_attention", "budget_s": 30,
                        "what": "writes one table"}]
    new = Path(paths.target_dir("h200")) / "case/time/v/new.samples.csv"
    writes = (f"import pathlib; p = pathlib.Path({str(new)!r}); "
              "p.parent.mkdir(parents=True, exist_ok=True); p.write_text('sample')")
    ran = tmp_path / "records_ran"
    monkeypatch.setattr(gpu_window, "commands", lambda w, t, o: [
        [[sys.executable, "-c", f"open({str(ran)!r}, 'w')"]], [[sys.executable, "-c", writes]]])
    first = gpu_window.run(window, "h200", tmp_path / "first")
    write_target_records(tmp_path, "h200", commit=provenance.commit())  # its records step's
    samples = Path(paths.target_dir("h200")) / "case/tiles/v/p.samples"  # a directory() output
    samples.mkdir(parents=True)
    (samples / "block128.csv").write_text("sample")
    hours_ago = time.time() - 3600
    for path in (samples / "block128.csv", samples):
        os.utime(path, (hours_ago, hours_ago))
    earlier = archive.pack("h200", tmp_path / "a", 2**20)["file"]
    shutil.rmtree(paths.target_dir("h200"))  # a fresh tree on the host
    ran.unlink()
    for log in Path(paths.LOGS).rglob("*.log"):  # the first window's, minutes before
        os.utime(log, (time.time() - 600, time.time() - 600))

    done = gpu_window.run(window, "h200", tmp_path / "second", [Path(earlier)])
    assert not ran.exists()
    assert [s["status"] for s in done["steps"]] == [gpu_window.CARRIED, "done"]
    assert done["steps"][1]["log"].endswith("01_measure_splash_attention_w2.log")
    carried = Path(paths.host_record("h200"))
    assert carried.stat().st_mtime < new.stat().st_mtime <= time.time()
    # Snakemake redoes a job whose output, a folder dated by its own time, is older
    # than an input: every carried folder is dated with the records.
    assert samples.stat().st_mtime == carried.stat().st_mtime
    with tarfile.open(done["archive"]["file"]) as tar:
        names = set(tar.getnames())
    assert {"results/h200/case/time/v/new.samples.csv", "results/h200/gpu_window.json",
            "results/h200/env.json", "results/h200/host.json",
            "results/h200/logs/gpu_window/01_measure_splash_attention_w2.log"} <= names
    assert "results/h200/logs/gpu_window/00_records_.log" not in names  # the first's own
    record = records.read(paths.gpu_window_record("h200"), "gpu_window")
    assert [c["seconds"] for c in record["continues"]] == [first["seconds"]]

    # Another commit's window: its host records are kept, its job records where current.
    other = tmp_path / "other.tar.xz"
    shutil.copy(earlier, other)
    stale_record = "results/h200/splash_attention/verify/mgpu/p.json"

    def of_another_commit(members):
        for name in [m for m in members if m.endswith(".json") and "/logs/" not in m]:
            members[name] = json.dumps({**json.loads(members[name]), "commit": "1" * 40}
                                       ).encode()
        members[stale_record] = json.dumps(job_record("verify", "1" * 40, "0" * 64)).encode()

    rewrite(other, of_another_commit)
    done = gpu_window.run(window, "h200", tmp_path / "third", [other])
    assert records.read(paths.host_record("h200"), "host")["commit"] == "1" * 40
    assert not Path(stale_record).exists()
    assert records.read(paths.gpu_window_record("h200"), "gpu_window")["not_carried"] == [
        stale_record]


def job_record(kind: str, commit: str, sources_sha256: str | None = None) -> dict:
    """A committed h200 record of ``kind`` of splash attention, made at ``commit`` from
    ``sources_sha256`` (None: the hash this tree gives its job)."""
    record = json.loads((paths.SOURCE_ROOT / f"{TIMED.replace('/time/', f'/{kind}/')}.json"
                         ).read_text())
    spec = paths.for_target(config.load_case(paths.SOURCE_ROOT / config.SHIPPED_CASES,
                                             "splash_attention"), "h200")
    want = carry.recomputed(record, spec)
    return {**record, "commit": commit, "sources_sha256": sources_sha256 or want}


def test_a_record_of_another_commit_is_carried_only_where_current_here(tmp_path,
                                                                      monkeypatch):
    """Kept: this commit's records, the host's, another commit's whose sources hash is the
    one recomputed here, and its unhashed records of a case whose hashed ones all are.
    Removed with their samples: the rest."""
    monkeypatch.chdir(tmp_path)
    old, older = "1" * 40, "3" * 40
    write_target_records(tmp_path, "h200", commit=old)
    folder = Path(paths.target_dir("h200")) / "splash_attention"
    made = {
        "time/mgpu/current.json": job_record("time", old),
        "verify/mgpu/current.json": job_record("verify", old),
        "baseline/b/current.json": {"kind": "baseline", "commit": old,
                                    "case": "splash_attention"},
        "time/mgpu/stale.json": job_record("time", older, "0" * 64),
        "baseline/b/stale.json": {"kind": "baseline", "commit": older,
                                  "case": "splash_attention"},
        "time/mgpu/here.json": job_record("time", HEAD, "0" * 64),
    }
    for name, record in made.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(record))
    (folder / "time/mgpu/stale.samples.csv").write_text("sample\n")
    timed = job_record("time", old)
    spec = paths.for_target(config.load_case(paths.SOURCE_ROOT / config.SHIPPED_CASES,
                                             "splash_attention"), "h200")
    trial = {"kind": "check_power_trial", "commit": old, "case": "splash_attention",
             "point": timed["point"]}
    trial["sources_sha256"] = carry.recomputed(trial, spec)
    kept = folder / f"check_power/{timed['point']}.trials"  # a power job's trials in hand
    kept.mkdir(parents=True)
    (kept / "trial-0.json").write_text(json.dumps(trial))
    (kept / "trial-1.json").write_text(json.dumps({**trial, "commit": older,
                                                   "sources_sha256": "0" * 64}))
    dropped = carry.not_current("h200", HEAD)
    assert sorted(str(p.relative_to(folder)) for p in dropped) == [
        "baseline/b/stale.json", f"check_power/{timed['point']}.trials/trial-1.json",
        "time/mgpu/stale.json", "time/mgpu/stale.samples.csv"]
    bad = job_record("verify", old, "0" * 64)
    (folder / "verify/mgpu/current.json").write_text(json.dumps(bad))
    assert "baseline/b/current.json" in {  # a hashed record of its commit and case is stale
        str(p.relative_to(folder)) for p in carry.not_current("h200", HEAD)}


def test_an_autotune_step_tunes_its_points_in_order_and_the_last_one_the_rest(tmp_path,
                                                                             monkeypatch):
    """On the TPU the tile choices at the publishable points come first, one at a time,
    forward before backward (a cut loses the choice in hand, not the plan's order), and
    nothing else (each point's measure needs its own choice only); the plan's last step,
    with no points, runs `autotune`: the rest and the table. A choice a continued window
    carried is not asked for again."""
    monkeypatch.chdir(tmp_path)
    window = gpu_window.load(gpu_window.WINDOW_CONFIG.with_name("tpu-window.yaml"))
    step, rest = [s for s in window["steps"] if s["name"] == "autotune"]
    index = window["steps"].index(step)
    assert window["steps"][-1] == rest and "points" not in rest and "case" not in rest

    def asked(at: int) -> list[list[str]]:
        argvs = gpu_window.commands(window, "tpu-v5e", "o.yaml")[at]
        return [argv[argv.index("--") + 1:] for argv in argvs]

    choices = [[paths.tile_choice_record("tpu-v5e", "splash_attention", v, p)]
               for p in step["points"] for v in ("upstream", "upstream_bwd")]
    assert asked(index) == choices
    assert asked(len(window["steps"]) - 1) == [["autotune"]]
    for (name,) in choices[:3]:
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text("{}")
    assert asked(index) == choices[3:]
    monkeypatch.chdir(paths.SOURCE_ROOT)
    window["steps"][index] = {k: v for k, v in step.items() if k != "case"}
    with pytest.raises(CasebookError,
                       match="only a measure, check_power or autotune step names points"):
        bad = Path(tempfile.mkdtemp()) / "plan.yaml"
        bad.write_text(yaml.safe_dump(window))
        gpu_window.load(bad)


def test_a_measure_step_asks_for_each_points_comparison_alone_in_order():
    window = gpu_window.load()
    steps = window["steps"]
    argvs = gpu_window.commands(window, "h200", "overlay.yaml")
    measured = [(s, a) for s, a in zip(steps, argvs, strict=True) if s["name"] == "measure"]
    assert [s["case"] for s, _ in measured[:3]] == [
        "grouped_gemm_fp8_bf16", "splash_attention", "moe_nvfp4"]  # each case's first point
    for step, step_argvs in measured:
        wanted = [paths.compare_record("h200", step["case"], p) for p in step["points"]]
        assert [argv[argv.index("--") + 1:] for argv in step_argvs] == [[w] for w in wanted]
    # Each case's first point is measured by the full plan.
    for case in ("grouped_gemm_fp8_bf16", "splash_attention", "moe_nvfp4"):
        first = gpu_window._case_spec(case, "h200")["points"][0]["name"]
        assert first in [p for s, _ in measured if s["case"] == case for p in s["points"]]


def test_a_measure_step_without_points_measures_every_point(tmp_path):
    window = yaml.safe_load(gpu_window.WINDOW_CONFIG.read_text())
    window["steps"] = [{"name": "measure", "case": "moe_nvfp4", "budget_s": 5, "what": "x"}]
    path = tmp_path / "gpu-window.yaml"
    path.write_text(yaml.safe_dump(window))
    [argvs] = gpu_window.commands(gpu_window.load(path), "h200", "o")
    points = [p["name"] for p in gpu_window._case_spec("moe_nvfp4", "h200")["points"]]
    assert [a[-1] for a in argvs] == [paths.compare_record("h200", "moe_nvfp4", p)
                                      for p in points]


def test_a_tpu_measure_step_takes_the_points_measured_there_alone(tmp_path):
    """A step may name a build-only point measured on some accelerator; without points,
    a TPU step measures the TPU's points, the interpreted ones and those."""
    window = yaml.safe_load(gpu_window.WINDOW_CONFIG.read_text())
    window["steps"] = [{"name": "measure", "case": "splash_attention", "budget_s": 5,
                        "what": "x", "points": ["s4k_d128_causal"]},
                       {"name": "measure", "case": "splash_attention", "budget_s": 5,
                        "what": "y"}]
    path = tmp_path / "tpu-window.yaml"
    path.write_text(yaml.safe_dump(window))
    named, every = gpu_window.commands(gpu_window.load(path), "tpu-v5e", "o")
    assert [a[-1] for a in named] == [
        paths.compare_record("tpu-v5e", "splash_attention", "s4k_d128_causal")]
    assert paths.compare_record("tpu-v5e", "splash_attention", "s4k_d128_local") in [
        a[-1] for a in every]
    window["steps"] = [{"name": "check_power", "case": "splash_attention", "budget_s": 5,
                        "what": "z", "points": ["s32k_d128_causal", "s4k_d128_local"]}]
    path.write_text(yaml.safe_dump(window))
    [power] = gpu_window.commands(gpu_window.load(path), "tpu-v5e", "o")
    assert [a[-1] for a in power] == [
        paths.check_power_record("tpu-v5e", "splash_attention", p)
        for p in ("s32k_d128_causal", "s4k_d128_local")]


@pytest.mark.parametrize("step, key, message", [
    ({"name": "measure", "case": "splash_attention", "points": ["nope"]}, "steps.0.points",
     "nope is not a point of splash_attention"),
    ({"name": "case", "case": "splash_attention", "points": ["mha_causal_f16"]},
     "steps.0.points", "only a measure, check_power or autotune step names points"),
    ({"name": "check_power"}, "steps.0.case", "a check_power step names its case"),
    ({"name": "measure", "case": "no_such_case"}, "steps.0.case", "no_such_case is not a case"),
    ({"name": "measure"}, "steps.0.case", "a measure step names its case"),
])
def test_a_plan_naming_an_unknown_case_or_point_is_refused(tmp_path, step, key, message):
    window = yaml.safe_load(gpu_window.WINDOW_CONFIG.read_text())
    window["steps"] = [{**step, "budget_s": 5, "what": "x"}]
    path = tmp_path / "gpu-window.yaml"
    path.write_text(yaml.safe_dump(window))
    with pytest.raises(CasebookError, match=f"{re.escape(key)}: {message}"):
        gpu_window.load(path)


def test_a_steps_commands_run_in_order_within_its_budget_past_a_failure(tmp_path):
    """A failed point does not stop the next; the step reports the first failure; a
    command cut by the budget ends the step."""
    log = tmp_path / "step.log"
    say = [[sys.executable, "-c", f"print({i}); exit({code})"] for i, code in
           enumerate([0, 4, 0])]
    assert gpu_window._run_all(say, time.monotonic() + 30, log) == ("failed", 4)
    assert log.read_text() == "0\n1\n2\n"
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    start = time.monotonic()
    assert gpu_window._run_all([sleep, say[0]], start + 1.5, log) == (
        "stopped at its budget", None)
    assert time.monotonic() - start < 60  # cut, not slept out
    assert log.read_text() == "0\n1\n2\n"  # the command after the cut one never ran


def write_target_records(root: Path, target: str, commit: str = HEAD) -> None:
    """env, host and a noise floor of ``target`` under ``root/results``, naming ``commit``."""
    bodies = {
        "env": {"target": target, **envcapture.capture("cuda")},
        "host": {"target": target, **hostcapture.capture(), "device_class": target},
    }
    for kind, body in bodies.items():
        path = root / getattr(paths, f"{kind}_record")(target)
        records.write(path, kind, body)
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "commit": commit}))
    samples = root / paths.target_dir(target) / "case" / "time" / "v" / "p.samples.csv"
    samples.parent.mkdir(parents=True, exist_ok=True)
    samples.write_text("sample,seconds\n0,1e-3\n")


def make_archive(tmp_path: Path, target: str = "h200", commit: str = HEAD) -> Path:
    source = tmp_path / "source"
    write_target_records(source, target, commit)
    out = tmp_path / "out"
    out.mkdir()
    name = out / "records.tar.xz"
    with tarfile.open(name, "w:xz") as tar:
        tar.add(source / "results", arcname="results")
    return name


def test_an_archive_imports_into_results_replacing_the_target(tmp_path):
    root = tmp_path / "repo"
    stale = root / "results" / "h200" / "stale.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    done = archive.import_archive(make_archive(tmp_path), root=root)
    assert done == {"target": "h200", "commits": [HEAD], "files": 3}
    assert not stale.exists()
    records.read(root / paths.host_record("h200"), "host")
    assert [p.name for p in (root / "results").iterdir()] == ["h200"]  # no staging left


def test_the_windows_of_one_plan_import_together_the_later_file_over_the_earlier(tmp_path):
    """A plan too long for one device command continues in the next: each brings its own
    archive; one import takes them all (each from a clean commit), a file in both being
    the later window's; archives of two targets are refused."""
    source = tmp_path / "a" / "source"
    write_target_records(source, "h200")
    (source / "results/h200/case/time/v/only.samples.csv").write_text(  # the first's alone
        "sample,seconds\n0,2e-3\n")
    first = tmp_path / "a" / "first.tar.xz"
    with tarfile.open(first, "w:xz") as tar:
        tar.add(source / "results", arcname="results")
    second = make_archive(tmp_path / "b")
    marked = json.loads((tmp_path / "b" / "source" / paths.host_record("h200")).read_text())
    root = tmp_path / "repo"
    done = archive.import_archive(first, second, root=root)
    assert done["files"] == 4 and done["commits"] == [HEAD]
    assert (root / "results/h200/case/time/v/only.samples.csv").exists()
    assert json.loads((root / paths.host_record("h200")).read_text()) == marked
    other = make_archive(tmp_path / "c", target="h100")
    with pytest.raises(CasebookError, match="one import takes one target"):
        archive.import_archive(first, other, root=tmp_path / "repo2")
    assert not (tmp_path / "repo2" / "results" / "h200").exists()


TIMED = "results/h200/splash_attention/time/mgpu/mha_causal_f16"  # a committed timed record


def test_an_import_keeps_the_store_across_commits_and_adds_the_archives_timed_records(
        tmp_path):
    """The target's records are replaced, its store of results across commits is not: an
    entry of an earlier commit stays, and the archive's timed record is kept at its own."""
    name = make_archive(tmp_path)

    def add_timed(members):
        record = json.loads((paths.SOURCE_ROOT / f"{TIMED}.json").read_text())
        members[f"{TIMED}.json"] = json.dumps({**record, "commit": HEAD}).encode()
        members[f"{TIMED}.samples.csv"] = (paths.SOURCE_ROOT / f"{TIMED}.samples.csv"
                                           ).read_bytes()

    rewrite(name, add_timed)
    root = tmp_path / "repo"
    earlier = paths.history_entry("h200", "1" * 40, "splash_attention", "time/mgpu/p")
    (root / earlier).parent.mkdir(parents=True)
    shutil.copy(paths.SOURCE_ROOT / paths.history_entry(
        "h200", "988ebe6625d8f7ca0645137d295aa875709ded32", "splash_attention",
        "time/mgpu/mha_causal_f16"), root / earlier)
    archive.import_archive(name, root=root)
    assert (root / earlier).is_file()
    kept = records.read(root / paths.history_entry(
        "h200", HEAD, "splash_attention", "time/mgpu/mha_causal_f16"), "history")
    assert kept["measured_commit"] == HEAD and len(kept["samples_s"]) > 5


def test_an_archive_carrying_a_store_is_refused(tmp_path):
    name = make_archive(tmp_path)
    member = f"results/h200/history/{HEAD}/case/time/v/p.json"
    rewrite(name, lambda members: members.update({member: b"{}"}))
    with pytest.raises(CasebookError, match="kept where it is imported, never carried"):
        archive.import_archive(name, root=tmp_path / "repo")


def test_pack_leaves_the_store_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_target_records(tmp_path, "h200")
    entry = tmp_path / paths.history_entry("h200", HEAD, "case", "time/v/p")
    entry.parent.mkdir(parents=True)
    entry.write_text("{}")
    packed = archive.pack("h200", tmp_path / "a", 10 * 2**20)
    with tarfile.open(packed["file"]) as tar:
        assert not [m for m in tar.getnames() if "/history/" in m]


def rewrite(name: Path, edit) -> None:
    """Apply ``edit(members: dict[name, bytes])`` to the archive ``name``."""
    with tarfile.open(name) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    edit(members)
    with tarfile.open(name, "w:xz") as tar:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_an_off_schema_record_is_refused_naming_it(tmp_path):
    name = make_archive(tmp_path)

    def drop_gpus(members):
        host = json.loads(members["results/h200/host.json"])
        del host["gpus"]
        members["results/h200/host.json"] = json.dumps(host).encode()

    rewrite(name, drop_gpus)
    with pytest.raises(CasebookError, match=r"results/h200/host\.json: gpus"):
        archive.import_archive(name, root=tmp_path / "repo")
    assert not (tmp_path / "repo" / "results" / "h200").exists()


@pytest.mark.parametrize("commit, message", [
    ("0" * 40, "not a clean commit of this repository"),
    (HEAD + "-dirty", "not a clean commit of this repository"),
    ("unknown (not a git checkout)", "not a clean commit of this repository"),
], ids=["unknown", "dirty", "not-a-checkout"])
def test_records_of_an_unknown_or_dirty_commit_are_refused(tmp_path, commit, message):
    with pytest.raises(CasebookError, match=message):
        archive.import_archive(make_archive(tmp_path, commit=commit), root=tmp_path / "repo")


def test_records_may_name_several_clean_commits_but_never_an_unknown_one(tmp_path,
                                                                        monkeypatch):
    """A window continuing an earlier commit's plan packs the records it kept from it:
    each commit is checked, none may be unknown."""
    earlier = "2" * 40
    monkeypatch.setattr(provenance, "known_commit", lambda sha: sha in (HEAD, earlier))

    def env_of(commit):
        def edit(members):
            env = json.loads(members["results/h200/env.json"])
            members["results/h200/env.json"] = json.dumps({**env, "commit": commit}).encode()
        return edit

    name = make_archive(tmp_path)
    rewrite(name, env_of(earlier))
    assert archive.import_archive(name, root=tmp_path / "repo")["commits"] == sorted(
        [HEAD, earlier])
    rewrite(name, env_of("1" * 40))
    with pytest.raises(CasebookError, match=r"env\.json: commit '1{40}' is not a clean"):
        archive.import_archive(name, root=tmp_path / "repo2")
    assert not (tmp_path / "repo2" / "results" / "h200").exists()


@pytest.mark.parametrize("member, message", [
    ("../evil.json", "not a path under results/<target>/"),
    ("results/h200/run.sh", "not a record, sample table or tile table"),
    ("results/cpu/env.json", "holds targets"),
])
def test_members_outside_one_gpu_target_are_refused(tmp_path, member, message):
    name = make_archive(tmp_path)
    rewrite(name, lambda members: members.update({member: b"{}"}))
    with pytest.raises(CasebookError, match=re.escape(message)):
        archive.import_archive(name, root=tmp_path / "repo")


def test_a_cpu_archive_is_refused(tmp_path):
    with pytest.raises(CasebookError, match="not an accelerator target"):
        archive.import_archive(make_archive(tmp_path, target="cpu"), root=tmp_path / "repo")


def test_pack_leaves_samples_out_only_when_they_do_not_fit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_target_records(tmp_path, "h200")
    big = tmp_path / paths.target_dir("h200") / "case" / "time" / "v" / "q.samples.csv"
    big.write_bytes(os.urandom(200_000))
    roomy = archive.pack("h200", tmp_path / "a", 10 * 2**20)
    tight = archive.pack("h200", tmp_path / "b", 150_000)
    assert not roomy["samples_dropped"] and tight["samples_dropped"]
    assert tight["members"] == roomy["members"] - 2
    with pytest.raises(CasebookError, match="over the 1000-byte limit"):
        archive.pack("h200", tmp_path / "c", 1000)


@pytest.mark.parametrize("timeout_s, ok", [(None, True), (-1, False)])
def test_the_windows_measurement_settings_reach_the_workflow(tmp_path, timeout_s, ok):
    window = copy.deepcopy(gpu_window.load())
    if timeout_s is not None:
        window["config"]["measurement"]["timeout_s"] = timeout_s
    overlay = tmp_path / "window.yaml"
    overlay.write_text(yaml.safe_dump(window["config"]))
    [argv] = gpu_window.commands(window, "cpu", str(overlay))[0]
    argv[argv.index("--"):argv.index("--")] = ["--dry-run", "--quiet", "rules"]
    done = subprocess.run(argv, cwd=paths.SOURCE_ROOT, capture_output=True, text=True)
    assert (done.returncode == 0) is ok, done.stdout[-2000:] + done.stderr[-2000:]
    if not ok:
        assert "measurement.timeout_s: -1 is less than or equal to the minimum of 0" in (
            done.stdout + done.stderr)


def test_a_tree_without_git_names_the_commit_it_was_given(monkeypatch):
    from casebook.core import provenance

    monkeypatch.setattr(provenance, "_git", lambda *args: None)
    monkeypatch.delenv(provenance.COMMIT_VARIABLE, raising=False)
    assert provenance.commit.__wrapped__() == "unknown (not a git checkout)"
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, HEAD)
    assert provenance.commit.__wrapped__() == HEAD


def test_the_commit_given_wins_over_a_git_carried_beside_the_tree(monkeypatch):
    """The device's copy of the tree came with another commit's .git."""
    from casebook.core import provenance

    monkeypatch.setattr(provenance, "_git", lambda *args: "f" * 40)
    monkeypatch.delenv(provenance.COMMIT_VARIABLE, raising=False)
    assert provenance.commit.__wrapped__().startswith("f" * 40)
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, HEAD)
    assert provenance.commit.__wrapped__() == HEAD


@pytest.fixture
def repo(monkeypatch, tmp_path):
    """A one-commit repository (a kernel and a committed record) as the project's root."""
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results/h200").mkdir(parents=True)
    (tmp_path / "results/h200/env.json").write_text("{}")
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/efficiency.json").write_text("{}")
    (tmp_path / "kernel.py").write_text("x = 1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(paths, "SOURCE_ROOT", tmp_path)
    return tmp_path


def test_a_carried_tree_names_its_commit_only_while_unchanged(repo, monkeypatch):
    from casebook.core import provenance

    stamp = provenance.tree_stamp()
    assert list(stamp["files"]) == ["kernel.py"] and len(stamp["commit"]) == 40
    monkeypatch.setattr(provenance, "_git", lambda *args: None)  # the host: no git
    (repo / "results/h200/env.json").write_text('{"new": 1}')
    assert provenance.tree_commit(stamp) == (stamp["commit"], [])
    (repo / "kernel.py").write_text("x = 2\n")
    assert provenance.tree_commit(stamp) == (stamp["commit"] + "-dirty", ["kernel.py"])


def test_records_rewritten_under_results_leave_the_commit_clean(repo):
    """Pipeline records and benchmark records alike: one benchmark's record rewritten
    leaves the next benchmark's commit clean."""
    from casebook.core import provenance

    tmp_path = repo
    (tmp_path / "results/h200/env.json").write_text('{"new": 1}')
    (tmp_path / "benchmarks/results/efficiency.json").write_text('{"new": 1}')
    assert not provenance.commit.__wrapped__().endswith("-dirty")
    (tmp_path / "kernel.py").write_text("x = 2\n")
    assert provenance.commit.__wrapped__().endswith("-dirty")


def test_a_stopped_step_leaves_no_job_behind(tmp_path):
    """A job that ignores SIGTERM, started by the step, is killed with the step's group."""
    pid_file = tmp_path / "job.pid"
    job = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    step = ("import subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', {job!r}]); time.sleep(60)")
    # The budget leaves the step and its job (two interpreter starts, 0.1 s here) 100
    # times their time to start on a loaded host before the step is stopped.
    budget = 10
    start = time.monotonic()
    status, code = gpu_window._run([sys.executable, "-c", step], budget, tmp_path / "step.log")
    assert (status, code) == ("stopped at its budget", None)
    assert time.monotonic() - start < budget + gpu_window.GRACE_S + 10
    pid = int(pid_file.read_text())
    for _ in range(300):  # SIGKILLed with its group: gone at once, 30 s on a loaded host
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"job {pid} outlived its stopped step")


def test_a_record_made_with_another_tile_row_is_not_carried(tmp_path, monkeypatch):
    """Whatever its commit, a time or compare record is kept only while its point's tile
    choice is the one it ran with: one made at the default blocks before the
    autotune picked others, or with another pick, is measured again."""
    monkeypatch.chdir(tmp_path)
    write_target_records(tmp_path, "h200")
    folder = Path(paths.target_dir("h200")) / "splash_attention"
    timed = job_record("time", HEAD)
    compared = json.loads((paths.SOURCE_ROOT / "results/h200/splash_attention/compare/"
                           "mha_causal_f16.json").read_text())
    compared = {**compared, "commit": HEAD, "pairs": [{"variant": timed["variant"],
                                                       "baseline": "b", "rounds": 5}]}
    for name, record in {"time/v/p.json": timed, "compare/p.json": compared}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(record))

    def dropped() -> list[str]:  # of the time and compare records (the choice is a fake's)
        return sorted(str(p.relative_to(folder)) for p in carry.not_current("h200", HEAD)
                      if p.relative_to(folder).parts[0] != "tiles")

    assert dropped() == []  # no tile choice: none applies, none cited
    tiles = {"block_q": 64, "block_kv": 64, "stages": 1, "compute_wgs": 1}
    write_choice(timed["variant"], timed["point"], timed["params"], tiles)
    assert dropped() == ["compare/p.json", "time/v/p.json"]  # made before the pick
    used = tile_table.apply("h200", "splash_attention", timed["variant"], timed["point"],
                            timed["params"])[1]
    (folder / "time/v/p.json").write_text(json.dumps({**timed, "tile_table": used}))
    (folder / "compare/p.json").write_text(json.dumps(
        {**compared, "tile_tables": {timed["variant"]: used}}))
    assert dropped() == []
    (folder / "time/v/p.json").write_text(json.dumps(
        {**timed, "tile_table": {**used, "tuned": {**tiles, "stages": 2}}}))
    assert dropped() == ["time/v/p.json"]  # another pick


def test_the_tpu_plans_measure_cases_01_and_03_before_case_02():
    """Cases 01 and 03 at their points (a few minutes: measured, then their check power)
    come before case 02's measurements, which hold the chip for windows, each step taking
    the rest, then case 02's check power, case 01 at the upstream benchmark's shapes (a
    minute or more a point on the host), and the other points' tile choices last; the dry
    run lists each of their comparisons."""
    for plan in ("configs/tpu-window.yaml", "configs/tpu-window-short.yaml"):
        steps = gpu_window.load(paths.SOURCE_ROOT / plan)["steps"]
        assert [(s["name"], s.get("case")) for s in steps] == [
            ("records", None), ("autotune", "splash_attention"), ("measure", "moe_nvfp4"),
            ("measure", "grouped_gemm_fp8_bf16"), ("check_power", "moe_nvfp4"),
            ("check_power", "grouped_gemm_fp8_bf16"), ("measure", "splash_attention"),
            ("check_power", "splash_attention"), ("measure", "moe_nvfp4"), ("autotune", None)]
        done = subprocess.run([sys.executable, "-m", "casebook.hosts.gpu_window", "--plan", plan,
                               "--target", "tpu-v5e", "--dry-run"], cwd=paths.SOURCE_ROOT,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        for step in [*steps[2:4], steps[-2]]:
            assert step["what"] in done.stdout
            for point in step["points"]:
                assert paths.compare_record("tpu-v5e", step["case"], point) in done.stdout
