"""The check-power stage: each case's near-miss mutants run through verify's own check.

A check that passes a wrong kernel certifies it. For every point, the case's correct
outputs (``model_outputs``) must pass and each of its mutants (``kernels.mutants``) must
fail, on fresh seeded inputs, trial after trial, judged as for a kernel whose outputs
were poisoned and for one whose were not; the smallest uniform bias the check detects,
relative to the output's RMS, is found by bisection. A mutant that passes in any trial is
not caught, and every figure showing that output is marked WEAK.

Each trial's outcome is kept as a check_power_trial record the moment it is made
(``paths.check_power_trials_dir``), so a job cut short (an accelerator window's end, a
device command's limit) resumes from the trials it finished, with their seed; the
check_power record then lists them as ``resumed``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from casebook.core import paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.stages import point_job, verify
from kernels import contract
from kernels.mutants import biased

BIAS_RANGE = (1e-9, 1.0)  # relative to the output's RMS: the bisection's bracket
BIAS_STEPS = 12  # log-space bisection: a factor of 10^(9/2^12) ≈ 1.005 at the end
# A kernel's outputs NaN before it ran (the interpreter's check) or not (a GPU, a timed
# run): a case's compare may hold poisoned outputs to more (rows never to be written).
POISON_MODES = {"plain": False, "poisoned": True}


@dataclasses.dataclass(frozen=True)
class Held:
    """Where a check-power job keeps each trial's outcome (check_power_trial records, one
    file a trial) and what a kept one must match to be taken back: ``identity``'s target,
    case, point, sources hash and trial count."""

    folder: Path
    identity: dict[str, Any]

    def resume(self, seed: int) -> tuple[int, dict[int, dict[str, Any]]]:
        """The seed to draw with and the trials already made with it: where kept trials
        match ``identity``, the lowest-numbered one's seed and every kept trial of that
        seed; else ``seed`` and none."""
        kept = [saved for saved in (records.read(path, "check_power_trial")
                                    for path in sorted(self.folder.glob("trial-*.json")))
                if all(saved.get(k) == v for k, v in self.identity.items())]
        if not kept:
            return seed, {}
        seed = min(kept, key=lambda saved: saved["trial"])["seed"]
        return seed, {saved["trial"]: saved for saved in kept if saved["seed"] == seed}

    def keep(self, seed: int, trial: int, outcome: dict[str, Any]) -> None:
        records.write(self.folder / f"trial-{trial}.json", "check_power_trial",
                      {**self.identity, "seed": seed, "trial": trial, "outcome": outcome})


def run(case_dir: str, case: str, point: str, target: str, out: str) -> dict[str, Any]:
    job = point_job.load(case_dir, case, target, point)
    sources = provenance.job_sha256(job.spec, point=point)
    held = Held(Path(paths.check_power_trials_dir(out)), {
        "target": target, "case": case, "point": point, "sources_sha256": sources,
        "trials": job.spec["verify"]["trials"]})
    record = records.write(out, "check_power", {
        "target": target, "case": case, "point": point, "params": job.params,
        "sources_sha256": sources,
        **measure(job.plugin, job.params, job.spec, job.path, point, held)})
    shutil.rmtree(held.folder, ignore_errors=True)
    return record


def _check(plugin, params, inputs, want, tolerance, output, value, correct,
           poisoned=False):
    """``output`` checked as ``value``, every other output as written correctly."""
    return verify.check_outputs(params, inputs, {output: value}, want, tolerance,
                                getattr(plugin, "compare", None), poisoned, correct)


def _detects(plugin, params, inputs, want, tolerance, output, value, correct,
             fraction) -> bool:
    return not _check(plugin, params, inputs, want, tolerance, output,
                      biased(value, fraction), correct)["passed"]


def smallest_bias(detects) -> float | None:
    """The smallest fraction in BIAS_RANGE that ``detects`` (monotone) flags; None if even
    the largest passes."""
    low, high = (math.log10(b) for b in BIAS_RANGE)
    if not detects(10**high):
        return None
    if detects(10**low):
        return 10**low
    for _ in range(BIAS_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if detects(10**middle) else (middle, high)
    return 10**high


def _both(plugin, params, inputs, want, tolerance, output, value, correct
          ) -> dict[str, Any]:
    """One output checked as a kernel's, with and without poisoned outputs."""
    return {mode: _summary(_check(plugin, params, inputs, want, tolerance, output, value,
                                  correct, poisoned))
            for mode, poisoned in POISON_MODES.items()}


def measure(plugin: Any, params: dict[str, Any], spec: dict[str, Any],
            path: object, point: str = "this point", held: Held | None = None
            ) -> dict[str, Any]:
    """The body of a check_power record: controls, mutants and the bias detected, each
    check made as for a kernel whose outputs were poisoned and for one whose were not.
    ``held``: where each trial is kept as it is made, and resumed from."""
    tolerance = verify.tolerance_of(spec, params, path)
    trials = spec["verify"]["trials"]
    seed, resumed = held.resume(verify.draw_seed()) if held else (verify.draw_seed(), {})
    mutants = plugin.mutants(params)
    outcomes = []
    for index, stream in enumerate(np.random.SeedSequence(seed).spawn(trials)):
        if index in resumed:
            outcomes.append(resumed[index]["outcome"])
            continue
        started = time.monotonic()
        outcomes.append(_trial(plugin, params, tolerance, mutants, stream, path, point))
        if held:
            held.keep(seed, index, outcomes[-1])
        print(f"casebook: check power at {point}: trial {index + 1} of {trials} made in "
              f"{time.monotonic() - started:.1f} s" + (", kept" if held else "")
              + (f" ({len(resumed)} resumed)" if resumed else ""), flush=True)
    return {"seed": seed, "trials": trials, **_summarised(outcomes, mutants),
            **({"resumed": [{"trial": index, "created_at": saved["created_at"],
                             "commit": saved["commit"]}
                            for index, saved in sorted(resumed.items())]}
               if resumed else {})}


def _trial(plugin: Any, params: dict[str, Any], tolerance: Any, mutants: list[Any],
           stream: np.random.SeedSequence, path: object, point: str) -> dict[str, Any]:
    """One trial on inputs drawn from ``stream``: each output's control (plain and
    poisoned) and smallest bias detected, each applicable mutant's checks."""
    inputs = plugin.make_inputs(params, np.random.default_rng(stream))
    want = plugin.oracle(params, inputs)
    correct = plugin.model_outputs(params, inputs, want)
    _whole_outputs(correct, path, point)
    controls, bias = {}, {}
    for output, value in correct.items():
        controls[output] = _both(plugin, params, inputs, want, tolerance, output, value,
                                 correct)
        bias[output] = smallest_bias(functools.partial(
            _detects, plugin, params, inputs, want, tolerance, output, value, correct))
    found = []
    for m in mutants:
        got = m.make(params, inputs, want, correct[m.output])
        if got is not None:
            found.append({"output": m.output, "name": m.name,
                          **_both(plugin, params, inputs, want, tolerance, m.output, got,
                                  correct)})
    return {"controls": controls, "bias": bias, "mutants": found}


def _summarised(outcomes: list[dict[str, Any]], mutants: list[Any]) -> dict[str, Any]:
    """The trials' outcomes gathered per output and per mutant, with the verdicts."""
    found = {(m.output, m.name): {"name": m.name, "output": m.output,
                                  "description": m.description,
                                  **{mode: [] for mode in POISON_MODES}}
             for m in mutants}
    controls: dict[str, dict[str, list[dict[str, Any]]]] = {}
    biases: dict[str, list[float | None]] = {}
    for outcome in outcomes:
        for output, checks in outcome["controls"].items():
            for mode in POISON_MODES:
                controls.setdefault(output, {m: [] for m in POISON_MODES})[mode].append(
                    checks[mode])
        for output, smallest in outcome["bias"].items():
            biases.setdefault(output, []).append(smallest)
        for made in outcome["mutants"]:
            row = found[made["output"], made["name"]]
            for mode in POISON_MODES:
                row[mode].append(made[mode])
    rows = [_verdict(row) for row in found.values()]
    applicable = [r for r in rows if r["applicable"]]
    return {
        "controls": {o: {"passed": all(c["passed"] for c in checks["plain"]),
                         "passed_poisoned": all(c["passed"] for c in checks["poisoned"]),
                         "trials": checks["plain"], "poisoned_trials": checks["poisoned"]}
                     for o, checks in controls.items()},
        "smallest_bias_detected": {o: None if None in b else max(b)
                                   for o, b in biases.items()},
        "mutants": rows,
        "applicable": len(applicable),
        "caught": sum(r["caught"] for r in applicable),
        "missed": [f"{r['output']}:{r['name']}" for r in applicable if not r["caught"]],
        "caught_poisoned": sum(r["caught_poisoned"] for r in applicable),
        "missed_poisoned": [f"{r['output']}:{r['name']}" for r in applicable
                            if not r["caught_poisoned"]],
    }


def _whole_outputs(correct: Any, path: object, point: str) -> None:
    """Refuse, naming the outputs, where the case's model outputs are sampled rows only (a
    case whose oracle answers sampled rows past its dense sizes, and has no whole
    reference to make them from): mutants are whole outputs a kernel could write."""
    sampled = {name: value for name, value in verify.named(correct).items()
               if isinstance(value, contract.SampledRows)}
    if sampled:
        rows = ", ".join(f"{name} ({v.rows} of {v.total} rows)" for name, v in sampled.items())
        raise CasebookError(path, "points", f"check power needs whole model outputs; at "
                            f"{point} the case gives sampled rows only: {rows}")


def _summary(check: dict[str, Any]) -> dict[str, Any]:
    return {"passed": check["passed"], "nan_count": check.get("nan_count") or 0,
            "max_abs_error": check.get("max_abs_error"),
            "worst_error_over_tolerance": check.get("worst_error_over_tolerance"),
            **({"error": check["error"]} if check.get("error") else {})}


def _verdict(row: dict[str, Any]) -> dict[str, Any]:
    """Caught: the check failed the mutant in every trial where it applies."""
    plain, poisoned = row.pop("plain"), row.pop("poisoned")
    return {**row, "trials": plain, "poisoned_trials": poisoned, "applicable": bool(plain),
            "caught": bool(plain) and not any(t["passed"] for t in plain),
            "caught_poisoned": bool(poisoned) and not any(t["passed"] for t in poisoned)}


def power(record: dict[str, Any], outputs: set[str] | frozenset[str],
          poisoned: bool = False) -> dict[str, Any]:
    """The check's power for a figure showing ``outputs`` whose kernel ran with poisoned
    outputs or not: mutants caught of those applicable, the ones missed, the smallest bias
    detected, whether each correct output passed its own check, and why it is weak."""
    caught, passed = ("caught_poisoned", "passed_poisoned") if poisoned else \
        ("caught", "passed")
    rows = [r for r in record["mutants"] if r["output"] in outputs and r["applicable"]]
    missed = [f"{r['output']}:{r['name']}" for r in rows if not r[caught]]
    controls = [record["controls"][o][passed] for o in outputs if o in record["controls"]]
    why = (f"lets {', '.join(missed)} pass" if missed else
           "fails the correct output" if not all(controls) else
           "no mutant covers what it computes" if not rows else None)
    return {"caught": len(rows) - len(missed), "applicable": len(rows), "missed": missed,
            "controls_passed": all(controls), "poisoned": poisoned,
            "bias": {o: record["smallest_bias_detected"].get(o) for o in sorted(outputs)
                     if o in record["smallest_bias_detected"]},
            "weak": why is not None, "why": why}
