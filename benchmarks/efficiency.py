"""Efficiency: wall time to a ±1% (95%) interval on the median, three protocols, one run.

- engine: 3 warm-up calls, then median precision ±1% (this project's default);
- do_bench-style: 25 ms of warm-up, then 100 ms of repeats (fixed); for equal
  precision the budget is doubled until the median's interval is within ±1%, and the
  wall time of that run is the fixed protocol's cost at equal precision;
- NVBench-style stdrel: 1 warm-up, stdev/mean ≤ 0.5% after ≥10 samples and 0.5 s of
  samples, plateau detection, 15 s timeout.

    .venv/bin/python -m benchmarks.efficiency [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.workloads import repeated_matmul, sample, write
from casebook.measure import stopping
from casebook.stages import timing

# The engine as shipped (the schema's measurement defaults), one repeat: one sampling run.
ENGINE = timing.default_settings(repeats=1)
TARGET = ENGINE.target
WORKLOADS = {"light (~20 µs)": 2, "medium (~0.2 ms)": 20, "heavy (~2 ms)": 200}


def engine_run(workload):
    return sample(workload, ENGINE.criterion_unit(), warmup_calls=ENGINE.warmup_calls)


def fixed_run(workload, budget_s=0.1):
    return sample(workload, stopping.TimeBudget(budget_s), warmup_s=0.025)


def fixed_at_equal_precision(workload):
    budget = 0.1
    while True:
        result = fixed_run(workload, budget)
        if result["precision"] <= TARGET or budget >= 12.8:
            return {**result, "budget_s": budget}
        budget *= 2


def nvbench_run(workload):
    criterion = stopping.RelativeNoise(0.005, stopping.Bounds(10, 0.5, 15.0))
    return sample(workload, criterion, warmup_calls=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report = {}
    for name, reps in WORKLOADS.items():
        workload = repeated_matmul(reps)
        runs = {"engine": [], "fixed_100ms": [], "fixed_equal_precision": [], "nvbench": []}
        for _ in range(args.repeats):  # interleaved, so drift hits all protocols alike
            runs["engine"].append(engine_run(workload))
            runs["fixed_100ms"].append(fixed_run(workload))
            runs["fixed_equal_precision"].append(fixed_at_equal_precision(workload))
            runs["nvbench"].append(nvbench_run(workload))
        summary = {k: {"median_wall_s": statistics.median(r["wall_s"] for r in v),
                       "median_precision": statistics.median(r["precision"] for r in v),
                       "median_samples": statistics.median(r["samples"] for r in v)}
                   for k, v in runs.items()}
        engine_wall = summary["engine"]["median_wall_s"]
        summary["ratios"] = {
            "engine_over_fixed_equal_precision":
                engine_wall / summary["fixed_equal_precision"]["median_wall_s"],
            "engine_over_fixed_100ms": engine_wall / summary["fixed_100ms"]["median_wall_s"],
            "engine_over_nvbench": engine_wall / summary["nvbench"]["median_wall_s"]}
        report[name] = {"summary": summary, "runs": runs}
        print(name, {k: round(v, 3) for k, v in summary["ratios"].items()},
              {k: (round(v["median_wall_s"], 3), f"±{v['median_precision']:.2%}")
               for k, v in summary.items() if k != "ratios"})
    print(f"wrote {write('efficiency', {'target': TARGET, 'repeats': args.repeats, **report})}")


if __name__ == "__main__":
    main()
