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
the case runs without a table: its config's row, or the port's default rule); the table
is generated from the records (``tile_table``).

Target ``cpu`` is refused: interpreter times say nothing about an accelerator's speed.
``choose`` is the mechanics, usable on any target (its tests run it on the CPU, each
candidate's execution marked as interpret mode); a run for a GPU or TPU target refuses a
runnable that would execute in an interpreter.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from casebook import (
    config,
    fmt,
    paths,
    provenance,
    records,
    stage,
    tile_table,
    timing,
    verify,
)
from casebook.errors import CasebookError
from kernels import contract


def _label(tiles: dict[str, int]) -> str:
    return "_".join(f"{k}{v}" for k, v in tiles.items())


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["ci_low_s"] <= b["ci_high_s"] and b["ci_low_s"] <= a["ci_high_s"]


def pick(candidates: list[dict[str, Any]], tie_rule: str) -> tuple[int | None, str]:
    """The index of the chosen candidate (None: none passed and was timed) and why.

    Each candidate: ``tiles``, ``tie_order``, ``verify`` (``passed``), ``timed`` and, if
    timed, ``measurement`` (``median_s``, ``ci_low_s``, ``ci_high_s``, ``confidence``);
    ``tie_rule`` says what the lowest ``tie_order`` means.
    """
    timed = [i for i, c in enumerate(candidates) if c["verify"]["passed"] and c["timed"]]
    if not timed:
        failed = sum(not c["verify"]["passed"] for c in candidates)
        return None, (f"no candidate both passed verification and was timed ({failed} of "
                      f"{len(candidates)} failed verification, the rest were not measurable)")
    m = {i: candidates[i]["measurement"] for i in timed}
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


def choose(plugin: Any, spec: dict[str, Any], case_path: Path, variant: str, point: str,
           target: str, measurement: dict[str, Any], found: dict[str, Any], out: str,
           samples_dir: str) -> dict[str, Any]:
    """Verify and time every kept candidate of ``found`` (the plug-in's
    ``tile_candidates``), pick one, write the tile_choice record to ``out``. A point with
    no candidate passing gets a record with no pick (its failures shown on the page and
    listed by the table as unpicked); the other points' picks still make the table."""
    case = spec["name"]
    params = config.find(spec["points"], point, case_path, "points")["params"]
    if not found["kept"]:
        raise CasebookError(out, "candidates", f"no tile candidate of {variant} at {point} "
                            f"fits: " + "; ".join(r["reason"] for r in found["rejected"]))
    seed = verify.draw_seed()  # each candidate's inputs: its own seed drawn from this one
    seeds = np.random.SeedSequence(seed).generate_state(len(found["kept"]), np.uint64) >> 1
    Path(samples_dir).mkdir(parents=True, exist_ok=True)
    candidates = [
        _candidate(plugin, variant, params, found["key"], c, spec, case_path, target,
                   measurement, int(one), f"{samples_dir}/{_label(c['tiles'])}.csv")
        for c, one in zip(found["kept"], seeds, strict=True)]
    chosen, reason = pick(candidates, found["tie_rule"])
    picked = None if chosen is None else candidates[chosen]["tiles"]
    record = records.write(out, "tile_choice", {
        "target": target, "case": case, "variant": variant, "point": point,
        "params": params, "sources_sha256": provenance.job_sha256(spec, variant, point),
        "key": found["key"], "seed": seed, "smem_limit_bytes": found["smem_limit_bytes"],
        "tie_rule": found["tie_rule"],
        "candidates": candidates, "rejected": found["rejected"],
        "pick": None if picked is None else {"tiles": picked},
        "reason": reason, "hand": found["hand"],
        "pick_is_hand": None if picked is None else picked == found["hand"]})
    if chosen is None:
        print(f"casebook: {out}: no pick: {reason}", flush=True)
    return record


def run(case_dir: str, case: str, variant: str, point: str, target: str,
        measurement: dict[str, Any], out: str, samples_dir: str) -> dict[str, Any]:
    """Stage: one point's autotune on an accelerator target (GPU or TPU)."""
    if target == "cpu":
        raise CasebookError(out, "target", tile_table.CPU_REFUSAL)
    job = stage.load(case_dir, case, target, point, variant, tuned=False)
    if not callable(getattr(job.plugin, "tile_candidates", None)):
        raise CasebookError(job.path, "autotune", f"kernels/{case} has no tile_candidates")
    return choose(job.plugin, job.spec, job.path, variant, point, target, measurement,
                  job.plugin.tile_candidates(variant, job.params), out, samples_dir)
