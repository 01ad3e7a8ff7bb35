"""One short run on an accelerator host (a GPU's or a TPU's): steps in priority order,
each stopped at its budget.

The plan is configs/gpu-window.yaml: env, host and noise-floor records first, then each
case's bit-exact comparison, its measured points (a point's comparison, with the verify,
time and baseline records it reads, one point after another), its GPU-only tests and its
remaining records, autotune last (on a TPU: the publishable points' tile choices first,
each point's jobs needing its own choice only; the other points' and the tile table last).
Every command of a step is a child process group (Snakemake or pytest) killed at the
step's budget or at the window's deadline, whichever comes first; records are written
atomically, so a stopped step leaves whole records or none. On a TPU, each step's
Snakemake runs share one chip holder that the window starts for the step
(``casebook.run.chip_holder``): the chip is opened once a step, not once a point.
The window then writes its own ``gpu_window`` record (each step's budget, seconds and
outcome) and packs ``results/<target>/`` and the logs into one archive
(``casebook.hosts.archive``).

    python -m casebook.hosts.gpu_window --dry-run [--target h200]   # the plan and its budgets
    python -m casebook.hosts.gpu_window --out DIR [--target h200]   # run it, archive in DIR

``--plan`` names another plan: configs/gpu-window-short.yaml (300 s) fits the device time
a session may have left after a full window; configs/tpu-window.yaml is the TPU host's
(benchmarks/tpu_host.sh), configs/tpu-window-short.yaml its 440 s cut.

``--continue A.tar.xz [B.tar.xz ...]``: the plan was too long for one device command; this
window takes the earlier windows' archives (carried with the tree), puts their records in
place (those of another commit only where still current here: ``casebook.hosts.carry``), skips
the records step, lets Snakemake skip every job whose record is there, and packs them
with its own (its logs alone). Its archive then
holds the whole plan so far; importing it (with the earlier ones) gives the same folder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from casebook.core import config, files, paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.hosts import archive, carry
from casebook.run import chip_holder
from casebook.stages import hostcapture, tile_table

WINDOW_CONFIG = paths.SOURCE_ROOT / "configs" / "gpu-window.yaml"
WINDOW_SCHEMA = paths.SCHEMA_DIR / "gpu-window.schema.yaml"
GRACE_S = 10  # after SIGTERM, before SIGKILL


def load(path: Path = WINDOW_CONFIG) -> dict[str, Any]:
    """The validated window plan; its budgets must fit the window."""
    window = config.read_yaml(path)
    config.validate(path, window, WINDOW_SCHEMA)
    spent = sum(s["budget_s"] for s in window["steps"] if s["budget_s"] != "rest") \
        + window["pack_s"]
    if spent > window["total_s"]:
        raise CasebookError(path, "steps", f"budgets and pack_s add up to {spent:g} s, "
                            f"more than total_s {window['total_s']:g}")
    cases = config.load_global()["cases"]
    for i, step in enumerate(window["steps"]):
        if step["name"] in ("gpu_tests", "case", "measure", "check_power", "bit_exact") \
                and "case" not in step:
            raise CasebookError(path, f"steps.{i}.case", f"a {step['name']} step names its case")
        if "case" in step and step["case"] not in cases:
            raise CasebookError(path, f"steps.{i}.case", f"{step['case']} is not a case of "
                                f"configs/config.yaml ({', '.join(cases)})")
        if "points" in step:
            if step["name"] not in ("measure", "check_power", "autotune") or "case" not in step:
                raise CasebookError(path, f"steps.{i}.points", "only a measure, check_power "
                                    "or autotune step names points, with its case")
            spec = config.load_case(config.load_global()["case_dir"], step["case"])
            known = [p["name"] for p in [*spec["points"], *spec["build_only_points"]]
                     if "measured_on" in p or p in spec["points"]]
            for point in step["points"]:
                if point not in known:
                    raise CasebookError(path, f"steps.{i}.points", f"{point} is not a point of "
                                        f"{step['case']} ({', '.join(known)})")
        if step["name"] == "gpu_tests" and not step.get("tests"):
            raise CasebookError(path, f"steps.{i}.tests", "a gpu_tests step lists its tests")
        for test in step.get("tests", []):
            if not (paths.SOURCE_ROOT / test).exists():
                raise CasebookError(path, f"steps.{i}.tests", f"{test} does not exist")
    _check_record_shape(path, window)
    return window


def _entry(step: dict[str, Any], log: str) -> dict[str, Any]:
    """A step's line in the window record, before its outcome."""
    return {"name": step["name"], "case": step.get("case"), "budget_s": step["budget_s"],
            "what": step["what"], "log": log}


def _check_record_shape(path: Path, window: dict[str, Any]) -> None:
    """Refuse a plan whose window record the records schema would refuse, before any
    step runs (that record is written after the last step, when the chip's time is spent)."""
    steps = [{**_entry(step, ""), "status": "skipped: no time left", "exit_code": None,
              "seconds": 0.0} for step in window["steps"]]
    try:
        records.check(path, "gpu_window", records.stamp("gpu_window", {
            "target": "cpu", "total_s": window["total_s"], "seconds": 0.0, "steps": steps}))
    except CasebookError as error:
        raise CasebookError(path, "steps", f"its window record would be refused: "
                            f"{error}") from None


def _snakemake(target: str, overlay: str, *targets: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--cores", "all", "--nolock",
            "--rerun-incomplete", "--keep-going", "--configfile", overlay,
            "--config", f"target={target}", "--", *targets]


def _case_spec(case: str, target: str) -> dict[str, Any]:
    return paths.for_target(config.load_case(config.load_global()["case_dir"], case), target)


def commands(window: dict[str, Any], target: str, overlay: str) -> list[list[list[str]]]:
    """The command lines of each step, in order; a step runs its commands one after another.

    A measure step runs one Snakemake per point, each asking for the point's comparison
    alone: its lowerings, verify, time and baseline records, and no build-only lowering
    that would hold cores a measurement (which takes them all) waits for.
    """
    out = []
    for step in window["steps"]:
        if step["name"] == "records":
            out.append([_snakemake(target, overlay, paths.env_record(target),
                                   paths.host_record(target),
                                   paths.noise_floor_record(target))])
        elif step["name"] == "gpu_tests":
            out.append([[sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         *step["tests"]]])
        elif step["name"] == "measure":
            points = step.get("points") or [
                p["name"] for p in _case_spec(step["case"], target)["points"]]
            out.append([_snakemake(target, overlay, paths.compare_record(target, step["case"], p))
                        for p in points])
        elif step["name"] == "check_power":
            points = step.get("points") or [
                p["name"] for p in _case_spec(step["case"], target)["points"]]
            out.append([_snakemake(target, overlay,
                                   paths.check_power_record(target, step["case"], p))
                        for p in points])
        elif step["name"] == "bit_exact":
            out.append([_snakemake(target, overlay, paths.bit_exact_record(target, step["case"]))])
        elif step["name"] == "case":
            out.append([_snakemake(target, overlay,
                                   *paths.case_records(_case_spec(step["case"], target),
                                                       target))])
        elif "points" in step:  # autotune at the named points: their choices, in order
            spec = _case_spec(step["case"], target)
            choices = [paths.tile_choice_record(target, step["case"], v, p)
                       for p in step["points"] for v in tile_table.tuned_variants(spec, target)]
            # a choice a continued window carried costs no Snakemake call
            out.append([_snakemake(target, overlay, c) for c in choices
                        if not Path(c).is_file()])
        else:  # autotune: every point's choice and the tile tables
            out.append([_snakemake(target, overlay, "autotune")])
    return out


def describe(window: dict[str, Any], target: str) -> str:
    """The plan as printed by --dry-run: each step, its budget, what it runs."""
    lines = [f"Window for target {target}: {len(window['steps'])} steps and packing, "
             f"at most {window['total_s']:g} s in all (archive <= {window['archive_mib']:g} MiB)"]
    overlay = "<window config>"
    start = 0.0
    end = window["total_s"] - window["pack_s"]
    for step, argvs in zip(window["steps"], commands(window, target, overlay), strict=True):
        label = step["name"] + (f" {step['case']}" if "case" in step else "")
        budget = end - start if step["budget_s"] == "rest" else step["budget_s"]
        plus = f"≥{budget:3.0f}" if step["budget_s"] == "rest" else f"{budget:4.0f}"
        lines.append(f"  {start:5.0f} s +{plus} s  {label}: {step['what']}")
        for argv in argvs:
            shown = step.get("tests") or argv[argv.index("--") + 1:]
            more = f" (+{len(shown) - 3} more)" if len(shown) > 3 else ""
            lines.append(f"               runs: {' '.join(argv[1:3])} {' '.join(shown[:3])}"
                         f"{more}")
        start += budget
    lines.append(f"  {start:5.0f} s +{window['pack_s']:4.0f} s  pack: results/{target}/ "
                 f"and logs/ into one .tar.xz")
    return "\n".join(lines)


def _reserved(steps: list[dict[str, Any]]) -> float:
    """The seconds ``steps`` hold back from a step taking the rest before them: their own
    budgets (a later step taking the rest gets what that one leaves)."""
    return sum(s["budget_s"] for s in steps if s["budget_s"] != "rest")


def _run(argv: list[str], seconds: float, log: Path) -> tuple[str, int | None]:
    """Run ``argv`` in its own process group for at most ``seconds``, its output appended
    to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        child = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = child.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            with contextlib.suppress(ProcessLookupError):  # jobs it left behind
                os.killpg(child.pid, signal.SIGKILL)
            return "stopped at its budget", None
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)
            raise
    return ("done" if code == 0 else "failed"), code


def _run_all(argvs: list[list[str]], deadline: float, log: Path) -> tuple[str, int | None]:
    """Run a step's commands one after another until ``deadline``; a failed command does
    not stop the next (each point is measured on its own). The step's outcome is the first
    failure, else done; stopped when the deadline cut a command."""
    failure = None
    for argv in argvs:
        left = deadline - time.monotonic()
        if left < 1:
            return "stopped at its budget", None
        status, code = _run(argv, left, log)
        if status == "stopped at its budget":
            return status, code
        if status == "failed" and failure is None:
            failure = (status, code)
    return failure or ("done", 0)


CARRIED = "skipped: records carried from an earlier window"


def _carry(target: str, archives: list[Path]) -> tuple[float, dict[str, Any], list[str]]:
    """Put the earlier windows' records in place for a continuing window (``archives``),
    those of another commit only where still current at this tree (``carry``; the rest
    removed, Snakemake redoes them), each file and folder dated just before now (an
    archive's dates are older than the tree's, and Snakemake would redo a record older
    than its sources); the time from which this window's own logs count, the earlier
    window's record, and the records not carried."""
    if not archives:
        raise CasebookError("--continue", None, "name the earlier windows' archives")
    archive.import_archive(*archives, on_host=True)
    if not Path(paths.gpu_window_record(target)).is_file():
        raise CasebookError(paths.gpu_window_record(target), None, "missing: the archives "
                            "are not a window's")
    earlier = records.read(paths.gpu_window_record(target), "gpu_window")
    dropped = carry.not_current(target, provenance.commit())
    for path in dropped:
        path.unlink()
    carried = time.time() - 2
    # Folders too: Snakemake dates a directory() output (a tile choice's samples) by the
    # folder's own time, which the archive left hours old.
    for path in Path(paths.target_dir(target)).rglob("*"):
        os.utime(path, (carried, carried), follow_symlinks=False)
    return carried + 1, earlier, [str(p) for p in dropped if p.suffix == ".json"]


def _continues(archives: list[Path], target: str) -> str:
    """The earlier windows' archives checked here as the window's host will check them
    (a start of the device spent on an archive it refuses is a start lost)."""
    for path in archives:
        found, _, _ = archive.check(path, on_host=True)
        if found != target:
            raise CasebookError(path, None, f"an archive of target {found}, not {target}")
    return f"continues {len(archives)} earlier windows' archives of {target} (checked)"


def _step_holder(step: dict[str, Any], target: str) -> Any:
    """A chip holder for a step's Snakemake runs on a TPU (they find it in the environment
    and start none of their own), else None. A pytest step opens the chip itself."""
    from casebook.run import off_device

    if target not in off_device.TPU_TARGETS or step["name"] == "gpu_tests":
        return None
    return chip_holder.start(Path(".snakemake"))


def run(window: dict[str, Any], target: str, out: Path,
        continues: list[Path] | None = None) -> dict[str, Any]:
    """Run every step within its budget, write the window record, pack the archive.

    A first window starts from no records of ``target`` (results/<target>/ carried with
    the tree holds an earlier plan's, committed). A window that ``continues`` earlier
    windows starts from their archives' records that are current here (``_carry``).
    """
    continuing = continues is not None
    since, earlier, dropped = _carry(target, continues) if continuing else (None, None, [])
    if not continuing:
        shutil.rmtree(paths.target_dir(target), ignore_errors=True)
    shutil.rmtree(chip_holder.LOG_DIR, ignore_errors=True)
    start = time.monotonic()
    deadline = start + window["total_s"] - window["pack_s"]
    overlay = Path(paths.LOGS) / "gpu_window" / "config.yaml"
    files.atomic_write_text(overlay, yaml.safe_dump(window["config"]))
    steps = []
    argvs = commands(window, target, str(overlay))
    # A continuing window's step logs are its own: _w2, _w3, ... (the earlier ones' keep theirs).
    suffix = f"_w{len(earlier.get('continues', [])) + 2}" if earlier else ""
    for index, (step, step_commands) in enumerate(zip(window["steps"], argvs, strict=True)):
        left = deadline - time.monotonic()
        seconds = (left - _reserved(window["steps"][index + 1:]) if step["budget_s"] == "rest"
                   else min(step["budget_s"], left))
        log = Path(paths.log("gpu_window",
                             f"{index:02d}_{step['name']}_{step.get('case', '')}{suffix}"))
        entry = _entry(step, str(log))
        if seconds < 1 or (continuing and step["name"] == "records"):
            steps.append({**entry, "exit_code": None, "seconds": 0.0,
                          "status": CARRIED if seconds >= 1 else "skipped: no time left"})
            continue
        log.unlink(missing_ok=True)
        began = time.monotonic()
        holder = _step_holder(step, target)
        try:
            status, code = _run_all(step_commands, began + seconds, log)
        finally:
            chip_holder.stop(holder)
        steps.append({**entry, "status": status, "exit_code": code,
                      "seconds": round(time.monotonic() - began, 1)})
        print(f"gpu_window: {step['name']} {step.get('case') or ''}: {status} "
              f"({steps[-1]['seconds']:.0f} of {seconds:.0f} s)", flush=True)
    body = {"target": target, "total_s": window["total_s"],
            "seconds": round(time.monotonic() - start, 1), "steps": steps}
    holders = [{key: held[key] for key in ("device_kind", "opened_s", "jobs", "failed", "job_s")}
               for held in chip_holder.opened()]
    if holders:
        opening = sum(held["opened_s"] for held in holders)
        body |= {"chip_holders": holders,
                 "opening_share": round(min(1.0, opening / body["seconds"]), 4)}
    if earlier is not None:
        body["continues"] = [*earlier.get("continues", []),
                             {key: earlier[key] for key in ("commit", "created_at", "seconds")}]
        if dropped:
            body["not_carried"] = dropped
    try:
        records.write(paths.gpu_window_record(target), "gpu_window", body)
    finally:  # a refused window record still leaves the chip's records packed
        packed = archive.pack(target, out, int(window["archive_mib"] * 2**20), since)
    return {**body, "archive": packed}


def host_target() -> str:
    """This host's device class: its GPU's, else its TPU's, else cpu. The TPU is asked in
    a child process: one process at a time can hold the chip, and the window's own must
    leave it to the jobs it starts."""
    gpus, _ = hostcapture.gpu_facts()
    if gpus:
        return hostcapture.device_class(gpus)
    asked = subprocess.run(
        [sys.executable, "-c", "from casebook.stages import hostcapture as h; "
         "print(h.device_class([], h.tpu_facts()[0]))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if asked.returncode:
        raise CasebookError("host", None, f"reading this host's TPU failed: "
                            f"{asked.stderr.strip()[-1000:]}")
    return asked.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m casebook.hosts.gpu_window",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--target", help="the device class (default: this host's)")
    parser.add_argument("--out", type=Path, help="where the archive goes")
    parser.add_argument("--plan", type=Path, default=WINDOW_CONFIG,
                        help="the window's plan (default configs/gpu-window.yaml)")
    parser.add_argument("--continue", dest="continues", nargs="+", type=Path,
                        metavar="ARCHIVE", help="continue the plan of these earlier windows "
                        "(their archives: records of another commit kept where current here)")
    args = parser.parse_args(argv)
    try:
        window = load(args.plan)
        found = host_target()
        target = args.target or found
        if args.dry_run:
            print(describe(window, target))
            if args.continues:
                print(_continues(args.continues, target))
            return 0
        if target == "cpu" or found != target:
            raise CasebookError("--target", None, f"{target}: this host is {found}; the window "
                                "measures an accelerator host of the target's kind")
        if args.out is None:
            raise CasebookError("--out", None, "name the folder for the archive")
        if not re.fullmatch(r"[0-9a-f]{40}", provenance.commit()):
            raise CasebookError(provenance.COMMIT_VARIABLE, None, f"the records would name "
                                f"commit {provenance.commit()!r}, which no import accepts: "
                                "run a clean checkout, or set it to the commit of this tree")
        done = run(window, target, args.out, args.continues)
    except CasebookError as error:
        print(f"casebook: error: {error}", file=sys.stderr)
        return 1
    print(f"gpu_window: {done['archive']['file']} ({done['archive']['bytes'] / 2**20:.1f} MiB"
          f"{', samples left out' if done['archive']['samples_dropped'] else ''})")
    return 0 if all(s["status"] in ("done", CARRIED) for s in done["steps"]) else 2


if __name__ == "__main__":
    raise SystemExit(main())
