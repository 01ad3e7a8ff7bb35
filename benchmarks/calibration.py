"""Calibration on CPU: false verdicts over A/A trials, detection of true 5% and 10% effects.

Each trial measures two workloads with the engine as the pipeline does (the settings of
configs/config.yaml's ``measurement``: median precision ±1% per repeat, its repeats,
guards on, the process pinned as a cpu job is) and compares them against the floor
measured first by the A/A protocol of the same design on the same base workload.
``--design paired`` (the compare stage's): both measured interleaved in one measurement,
the speedup the median of the per-round ratios, against the paired floor.
``--design separate``: one measurement after the other, in alternating order, the
bootstrap ratio of medians against the floor of separate measurements. Results go to
``calibration_<design>.json``.

    .venv/bin/python -m benchmarks.calibration [--design paired] [--aa 1000] [--ab 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks.workloads import repeated_matmul, write
from casebook.core import config
from casebook.measure import engine, noise, pinning, stats
from casebook.stages import timing

BASE_REPS = 20  # ~0.2 ms per call: 20 units of work


class Design:
    """How one trial measures two workloads and compares them, and the A/A floor of it."""

    def __init__(self, name: str, settings: engine.Settings, devices: engine.Devices):
        self.name, self.settings, self.devices = name, settings, devices

    def _measure(self, first: engine.Workload, second: engine.Workload, seed: int):
        if self.name == "paired":
            both = engine.measure_interleaved({"a": first, "b": second}, self.settings,
                                              "hot", seed, self.devices)
            return stats.paired_rounds(both["a"].kept_by_round, both["b"].kept_by_round)
        a = engine.measure(first, self.settings, "hot", seed, self.devices)
        return a.kept, engine.measure(second, self.settings, "hot", seed + 1,
                                      self.devices).kept

    def floor(self, base: engine.Workload, rounds: int) -> float:
        if self.name == "paired":
            return noise.a_a_paired(lambda seed: engine.measure_interleaved(
                {"A": base, "A'": base}, self.settings, "hot", 2 * seed, self.devices),
                rounds, 0.95)["noise_floor"]
        return noise.a_a(lambda seed: engine.measure(base, self.settings, "hot", seed,
                                                     self.devices), rounds, 0.95)["noise_floor"]

    def verdict(self, candidate: engine.Workload, reference: engine.Workload, seed: int,
                swap: bool, floor: float) -> str:
        """The verdict on ``candidate`` against ``reference``; ``swap``: measure the
        reference first (separate) or name it first (paired: the order is shuffled)."""
        if swap:
            ref, cand = self._measure(reference, candidate, seed)
        else:
            cand, ref = self._measure(candidate, reference, seed)
        compare = stats.compare_paired if self.name == "paired" else stats.compare
        return compare(cand, ref, 0.95, floor).verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--design", choices=("paired", "separate"), default="paired")
    parser.add_argument("--aa", type=int, default=1000, help="A/A trials")
    parser.add_argument("--ab", type=int, default=100, help="A/B trials per effect size")
    parser.add_argument("--rounds", type=int, default=20, help="A/A rounds for the floor")
    args = parser.parse_args()
    measurement = config.load_global()["measurement"]
    pinned = pinning.pin_for("cpu", measurement)  # numpy only: jax is never imported
    settings = timing.settings_of(measurement)
    design = Design(args.design, settings, engine.Devices.find())
    base = repeated_matmul(BASE_REPS)
    started = time.perf_counter()
    floor = design.floor(base, args.rounds)
    print(f"{args.design} noise floor ±{floor:.2%}")
    aa = {v: 0 for v in (stats.FASTER, stats.SLOWER, stats.SAME, stats.AMBIGUOUS)}
    for t in range(args.aa):
        aa[design.verdict(base, base, 2 * t, bool(t % 2), floor)] += 1
    false = aa[stats.FASTER] + aa[stats.SLOWER]
    false_share = false / args.aa
    low, high = stats.share_interval(false, args.aa, 0.95)
    print(f"A/A: {aa}, false FASTER/SLOWER {false_share:.1%} (95% interval "
          f"{low:.2%}–{high:.2%})")
    detection = {}
    for effect, reps in ((0.05, 21), (0.10, 22)):
        slower = repeated_matmul(reps)
        verdicts = {v: 0 for v in aa}
        for t in range(args.ab):
            verdicts[design.verdict(base, slower, 10_000 + 2 * t, bool(t % 2), floor)] += 1
        detection[f"{effect:.0%}"] = {
            "trials": args.ab, "verdicts": verdicts,
            "detected_share": verdicts[stats.FASTER] / args.ab,
            "floor_allows": effect > floor}
        print(f"A/B {effect:.0%}: {verdicts}")
    path = write(f"calibration_{args.design}", {
        "workload": f"{BASE_REPS} × 64×64 float64 matmul (numpy), hot",
        "design": args.design, "settings": dataclasses.asdict(settings),
        "pinned_cpu": pinned, "noise_floor": floor, "aa_trials": args.aa, "aa_verdicts": aa,
        "aa_false_share": false_share, "ab": detection,
        "wall_s": time.perf_counter() - started,
        "targets": {"aa_false_share_max": 0.05, "detected_share_min": 0.95}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
