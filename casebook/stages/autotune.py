"""Autotune (accelerator hosts only): measure a point's tile candidates and pick one.

For each candidate the case's plug-in offers (optional surface ``tile_candidates(variant,
params) -> {key, kept, rejected, smem_limit_bytes, tie_rule, hand}``), the kernel is built with
that tile row, checked once against the case's oracle at the case's tolerance (as ``verify``
does) and, only if it passed, timed by the measurement engine (as ``time`` does). A
candidate that fails verification is recorded and never picked. The pick: the fastest
median, unless other candidates' confidence intervals overlap its interval; then the
tied group goes to the lowest ``tie_order`` (the plug-in's ``tie_rule``: for splash
attention, fewer stages, then fewer compute warpgroups). The tile_choice record keeps
every candidate with its evidence, and whether the pick is the ``hand`` choice (the tiles
the case runs without a tile choice: its config's row, or the port's default rule); the table
is generated from the records (``tile_table``). Each candidate's outcome is kept as a
tile_candidate record the moment it is made (``paths.tile_candidates_dir``), so a job cut
short (an accelerator window's end) resumes from the candidates it finished; the record
then lists them as ``resumed`` and the pick compares intervals widened to the host's
noise floor, the candidates having run in separate jobs.

Target ``cpu`` is refused: interpreter times say nothing about an accelerator's speed.
``choose`` is the mechanics, usable on any target (its tests run it on the CPU, each
candidate's execution marked as interpret mode); a run for a GPU or TPU target refuses a
runnable that would execute in an interpreter.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from casebook.core import config, fmt, paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.measure import stats
from casebook.stages import point_job, tile_table, timing, verify
from kernels import contract


def _label(tiles: dict[str, int]) -> str:
    return "_".join(f"{k}{v}" for k, v in tiles.items())


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["ci_low_s"] <= b["ci_high_s"] and b["ci_low_s"] <= a["ci_high_s"]


def pick(candidates: list[dict[str, Any]], tie_rule: str, floor: float | None = None
         ) -> tuple[int | None, str]:
    """The index of the chosen candidate (None: none passed and was timed) and why.

    Each candidate: ``tiles``, ``tie_order``, ``verify`` (``passed``), ``timed`` and, if
    timed, ``measurement`` (``median_s``, ``ci_low_s``, ``ci_high_s``, ``confidence``);
    ``tie_rule`` says what the lowest ``tie_order`` means. ``floor``: the host's noise
    floor, each interval widened to it (candidates measured in separate jobs).
    """
    timed = [i for i, c in enumerate(candidates) if c["verify"]["passed"] and c["timed"]]
    if not timed:
        failed = sum(not c["verify"]["passed"] for c in candidates)
        return None, (f"no candidate both passed verification and was timed ({failed} of "
                      f"{len(candidates)} failed verification, the rest were not measurable)")
    m = {i: _widened(candidates[i]["measurement"], floor) for i in timed}
    fastest = min(timed, key=lambda i: m[i]["median_s"])
    tied = [i for i in timed if _overlap(m[i], m[fastest])]
    chosen = min(tied, key=lambda i: (candidates[i]["tie_order"], m[i]["median_s"]))
    level = f"{m[fastest]['confidence']:.0%}"
    first = (f"fastest median {fmt.seconds(m[fastest]['median_s'])} "
             f"({_label(candidates[fastest]['tiles'])})")
    if len(tied) == 1:
        return chosen, f"{first}; its {level} interval overlaps no other candidate's"
    others = ", ".join(_label(candidates[i]["tiles"]) for i in tied if i != fastest)
    return chosen, (f"{first}; {len(tied) - 1} other(s) within its {level} interval "
                    f"({others}): tie broken toward {tie_rule} -> "
                    f"{_label(candidates[chosen]['tiles'])} "
                    f"(median {fmt.seconds(m[chosen]['median_s'])})")


def _widened(measured: dict[str, Any], floor: float | None) -> dict[str, Any]:
    if floor is None:
        return measured
    low, high = stats.floor_interval(measured["median_s"], floor)
    return {**measured, "ci_low_s": min(measured["ci_low_s"], low),
            "ci_high_s": max(measured["ci_high_s"], high)}


def _check_once(plugin: Any, runnable: Any, params: dict[str, Any], spec: dict[str, Any],
                case_path: object, rng: np.random.Generator) -> dict[str, Any]:
    """One draw of fresh inputs against the oracle, exactly as ``verify`` checks a trial
    (a candidate that raises fails, visibly, and is dropped)."""
    inputs = plugin.make_inputs(params, rng)
    check = verify.check_trial(runnable, plugin, params, inputs,
                               verify.tolerance_of(spec, params, case_path))
    if contract.races_found(plugin):
        return {**check, "passed": False, "error": "the interpreter's race detector "
                                                     "reported a race"}
    return check


def _candidate(plugin: Any, variant: str, params: dict[str, Any], key: str,
               found: dict[str, Any], spec: dict[str, Any], case_path: object, target: str,
               measurement: dict[str, Any], seed: int, samples_path: str) -> dict[str, Any]:
    tuned = {**params, key: found["tiles"]}
    entry: dict[str, Any] = {**found, "seed": seed}
    began = time.monotonic()
    contract.reset(plugin)
    try:
        runnable = plugin.kernel(variant, tuned, "time", build_dir=paths.build_dir(spec["name"]))
    except contract.NotRunnable as reason:
        return {**entry, "verify": {"passed": False, "error": f"not run here: {reason}"},
                "timed": False, "not_timed_reason": f"not run here: {reason}"}
    if runnable.execution["interpret"] and target != "cpu":
        raise CasebookError(samples_path, "execution", f"the {variant} kernel would run in "
                            f"an interpreter on target {target}; its times would say "
                            f"nothing about the accelerator's speed")
    built = time.monotonic()
    entry.update(execution=runnable.execution,
                 verify=_check_once(plugin, runnable, tuned, spec, case_path,
                                    np.random.default_rng(seed)))
    checked = time.monotonic()
    if not entry["verify"]["passed"]:
        return {**entry, "timed": False, "not_timed_reason": "failed verification"}
    # No floor: candidates measured back to back in one job are compared with each other,
    # and widening every interval by the host's drift between jobs would tie them all.
    measured = timing.measure(runnable, lambda rng: plugin.make_inputs(tuned, rng),
                              measurement, spec["measurement"]["cache"], seed, samples_path,
                              floor=None, check=verify.oracle_check(
                                  plugin, tuned, spec, case_path, runnable))
    print(f"autotune: {_label(found['tiles'])}: built in {built - began:.1f} s, checked in "
          f"{checked - built:.1f} s, measured with its guards in "
          f"{time.monotonic() - checked:.1f} s", flush=True)
    return {**entry, **measured}


def _saved(path: Path, found: dict[str, Any], sources: str, target: str,
           measurement: dict[str, Any]) -> dict[str, Any] | None:
    """The tile_candidate record at ``path`` where it holds candidate ``found`` measured
    from these sources, on this target, with these settings, its samples at hand; else
    None (it is measured again)."""
    if not path.is_file():
        return None
    saved = records.read(path, "tile_candidate")
    entry = saved["candidate"]
    if (saved["sources_sha256"], saved["target"], saved["measurement_settings"],
            entry["tiles"]) != (sources, target, measurement, found["tiles"]):
        return None
    if "measurement" in entry and not Path(entry["measurement"]["samples_file"]).is_file():
        return None
    return saved


def _candidates(plugin: Any, spec: dict[str, Any], case_path: Path, variant: str,
                point: str, target: str, measurement: dict[str, Any],
                found: dict[str, Any], out: str, seed: int
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every kept candidate's entry, each kept as a tile_candidate record as soon as it
    is made (a job cut short resumes from those of the same sources and settings), and
    those resumed (their tiles, when and at which commit they were made)."""
    params = config.find(spec["points"], point, case_path, "points")["params"]
    sources = provenance.job_sha256(spec, variant, point)
    held = Path(paths.tile_candidates_dir(out))
    held.mkdir(parents=True, exist_ok=True)
    seeds = np.random.SeedSequence(seed).generate_state(len(found["kept"]), np.uint64) >> 1
    entries, resumed = [], []
    for c, one in zip(found["kept"], seeds, strict=True):
        path = held / f"{_label(c['tiles'])}.json"
        saved = _saved(path, c, sources, target, measurement)
        if saved is not None:
            entries.append(saved["candidate"])
            resumed.append({"tiles": c["tiles"], "created_at": saved["created_at"],
                            "commit": saved["commit"]})
            continue
        entries.append(_candidate(plugin, variant, params, found["key"], c, spec, case_path,
                                  target, measurement, int(one),
                                  str(path.with_suffix(".samples.csv"))))
        records.write(path, "tile_candidate", {
            "target": target, "case": spec["name"], "variant": variant, "point": point,
            "sources_sha256": sources, "measurement_settings": measurement,
            "candidate": entries[-1]})
    return entries, resumed


def _settle_samples(entries: list[dict[str, Any]], samples_dir: str) -> list[dict[str, Any]]:
    """The entries with each measured candidate's samples moved to the record's own
    samples folder."""
    Path(samples_dir).mkdir(parents=True, exist_ok=True)
    settled = []
    for entry in entries:
        if "measurement" in entry:
            table = f"{samples_dir}/{_label(entry['tiles'])}.csv"
            shutil.copyfile(entry["measurement"]["samples_file"], table)
            entry = {**entry, "measurement": {**entry["measurement"], "samples_file": table}}
        settled.append(entry)
    return settled


def choose(plugin: Any, spec: dict[str, Any], case_path: Path, variant: str, point: str,
           target: str, measurement: dict[str, Any], found: dict[str, Any], out: str,
           samples_dir: str, floor: float | None = None) -> dict[str, Any]:
    """Verify and time every kept candidate of ``found`` (the plug-in's
    ``tile_candidates``), pick one, write the tile_choice record to ``out``. A point with
    no candidate passing gets a record with no pick (its failures shown on the page and
    listed by the table as unpicked); the other points' picks still make the table.
    Candidates an earlier, cut-short job measured are resumed; the pick then widens every
    interval to ``floor``, the host's noise floor (the candidates ran in separate jobs)."""
    case = spec["name"]
    params = config.find(spec["points"], point, case_path, "points")["params"]
    if not found["kept"]:
        raise CasebookError(out, "candidates", f"no tile candidate of {variant} at {point} "
                            f"fits: " + "; ".join(r["reason"] for r in found["rejected"]))
    seed = verify.draw_seed()  # each candidate's inputs: its own seed drawn from this one
    entries, resumed = _candidates(plugin, spec, case_path, variant, point, target,
                                   measurement, found, out, seed)
    candidates = _settle_samples(entries, samples_dir)
    applied = floor if resumed else None
    chosen, reason = pick(candidates, found["tie_rule"], applied)
    picked = None if chosen is None else candidates[chosen]["tiles"]
    record = records.write(out, "tile_choice", {
        "target": target, "case": case, "variant": variant, "point": point,
        "params": params, "sources_sha256": provenance.job_sha256(spec, variant, point),
        "key": found["key"], "seed": seed, "smem_limit_bytes": found["smem_limit_bytes"],
        "tie_rule": found["tie_rule"],
        "candidates": candidates, "rejected": found["rejected"],
        "pick": None if picked is None else {"tiles": picked},
        "reason": reason, "hand": found["hand"],
        "pick_is_hand": None if picked is None else picked == found["hand"],
        **({"resumed": resumed, "floor_applied": applied} if resumed else {})})
    shutil.rmtree(paths.tile_candidates_dir(out))
    if chosen is None:
        print(f"casebook: {out}: no pick: {reason}", flush=True)
    return record


def run(case_dir: str, case: str, variant: str, point: str, target: str,
        measurement: dict[str, Any], out: str, samples_dir: str, floor_path: str
        ) -> dict[str, Any]:
    """Stage: one point's autotune on an accelerator target (GPU or TPU); ``floor_path``:
    the host's noise-floor record (applied where candidates were resumed)."""
    if target == "cpu":
        raise CasebookError(out, "target", tile_table.CPU_REFUSAL)
    job = point_job.load(case_dir, case, target, point, variant, tuned=False)
    if not callable(getattr(job.plugin, "tile_candidates", None)):
        raise CasebookError(job.path, "autotune", f"kernels/{case} has no tile_candidates")
    return choose(job.plugin, job.spec, job.path, variant, point, target, measurement,
                  job.plugin.tile_candidates(variant, job.params), out, samples_dir,
                  timing.host_floor(floor_path))
