"""Run-to-run honesty: the host's noise floor rerun, and whether reruns land in each
other's intervals.

Every run is a fresh process, as a pipeline job is: it pins itself (or not) before jax
starts, makes one measurement with the engine and prints it. Two protocols are
compared: ``before`` (one repeat, not pinned, no floor: the engine as it was) and
``config`` (configs/config.yaml's ``measurement``: repeats and pinning as the pipeline
runs them, each interval widened to the floor this protocol measured first, as a time
job widens it to its host's recorded floor).

- noise floor: the ``noise_floor`` stage's A/A protocols (separate measurements, and
  A and A' interleaved in one: the paired floor), ``--floors`` reruns per protocol;
- coverage: ``--runs`` independent measurements per protocol and workload; the share of
  ordered pairs (i, j), i ≠ j, whose median j lies inside interval i. The target is
  ≥ 95%: a record's interval then says where a rerun lands.

    .venv/bin/python -m benchmarks.rerun_coverage [--runs 20]
        [--floors 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from typing import Any

from benchmarks.workloads import write
from casebook.core import config

WORKLOADS = ("jax_matmul_256", "numpy_matmul_20x64")
TARGET = 0.95


def protocols() -> dict[str, dict[str, Any]]:
    shipped = config.load_global()["measurement"]
    return {"before": {**shipped, "repeats": 1, "pin_cpu": False}, "config": shipped}


def one(kind: str, measurement: dict[str, Any], workload: str, floor: float | None
        ) -> dict[str, Any]:
    """In a fresh process: pin as a job would, then one noise floor or one measurement."""
    from casebook.measure import pinning
    pinning.pin_for("cpu", measurement)
    from benchmarks.workloads import repeated_matmul
    from casebook.measure import engine, noise
    from casebook.stages import timing

    if kind == "floor":
        began = time.perf_counter()
        result = timing.a_a_floor(measurement)
        paired = result["paired"]
        return {"noise_floor": result["noise_floor"], "median_s": result["median_s"],
                "ratios_min": min(result["ratios"]), "ratios_max": max(result["ratios"]),
                "paired_floor": paired["noise_floor"],
                "paired_ratios_min": min(paired["ratios"]),
                "paired_ratios_max": max(paired["ratios"]),
                "paired_samples_per_series": paired["samples_per_series"],
                "wall_s": time.perf_counter() - began}
    settings = timing.settings_of(measurement)
    work = noise.matmul_workload(256) if workload.startswith("jax") else repeated_matmul(20)
    m = engine.measure(work, settings, "hot", 0, engine.Devices.find())
    s = m.summary(settings.confidence, floor)
    return {k: s[k] for k in ("median_s", "ci_low_s", "ci_high_s", "interval", "repeats",
                              "floor_applied", "pinned_cpu", "samples", "wall_s")}


def fresh(kind: str, measurement: dict[str, Any], workload: str = "",
          floor: float | None = None) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.rerun_coverage", "--one", kind,
                           json.dumps(measurement), workload, json.dumps(floor)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def coverage(runs: list[dict[str, Any]]) -> float:
    pairs = list(itertools.permutations(runs, 2))
    return sum(a["ci_low_s"] <= b["median_s"] <= a["ci_high_s"] for a, b in pairs) / len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="measurements per protocol")
    parser.add_argument("--floors", type=int, default=3, help="noise floors per protocol")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, measurement, workload, floor = args.one
        print(json.dumps(one(kind, json.loads(measurement), workload, json.loads(floor))))
        return
    started = time.perf_counter()
    result: dict[str, Any] = {"protocols": protocols(), "floors": {}, "coverage": {}}
    for name, measurement in result["protocols"].items():
        floors = [fresh("floor", measurement) for _ in range(args.floors)]
        result["floors"][name] = floors
        print(name, "noise floors", [f"±{f['noise_floor']:.1%}" for f in floors],
              "paired", [f"±{f['paired_floor']:.1%}" for f in floors])
        applied = floors[0]["noise_floor"] if name == "config" else None
        for workload in WORKLOADS:
            runs = [fresh("measure", measurement, workload, applied)
                    for _ in range(args.runs)]
            share = coverage(runs)
            result["coverage"].setdefault(name, {})[workload] = {
                "floor_applied": applied, "runs": runs, "pairs_inside": share,
                "meets_target": share >= TARGET}
            print(name, workload, f"reruns inside each other's intervals: {share:.1%}")
    path = write("rerun_coverage", {**result, "target": TARGET,
                                    "wall_s": time.perf_counter() - started})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
