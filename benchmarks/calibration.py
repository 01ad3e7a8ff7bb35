"""Calibration on CPU: false verdicts over A/A trials, detection of true 5% and 10% effects.

Each trial measures two workloads with the engine as the pipeline does (the settings of
configs/config.yaml's ``measurement``: median precision ±1% per repeat, its repeats,
guards on, the process pinned as a cpu job is), in alternating order, and compares them
against the floor measured first by the A/A protocol on the same base workload.

    .venv/bin/python -m benchmarks.calibration [--aa 200] [--ab 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks.workloads import repeated_matmul, write
from casebook import config, timing
from casebook.measure import engine, noise, pinning, stats

BASE_REPS = 20  # ~0.2 ms per call: 20 units of work


def _pair(first: engine.Workload, second: engine.Workload, seed: int,
          settings: engine.Settings, devices: engine.Devices) -> tuple[list, list]:
    a = engine.measure(first, settings, "hot", seed, devices)
    b = engine.measure(second, settings, "hot", seed + 1, devices)
    return a.kept, b.kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--aa", type=int, default=200, help="A/A trials")
    parser.add_argument("--ab", type=int, default=100, help="A/B trials per effect size")
    parser.add_argument("--rounds", type=int, default=20, help="A/A rounds for the floor")
    args = parser.parse_args()
    measurement = config.load_global()["measurement"]
    pinned = pinning.pin_for("cpu", measurement)  # numpy only: jax is never imported
    settings, devices = timing.settings_of(measurement), engine.Devices.find()
    base = repeated_matmul(BASE_REPS)
    started = time.perf_counter()
    floor = noise.a_a(lambda seed: engine.measure(base, settings, "hot", seed, devices),
                      args.rounds, 0.95)["noise_floor"]
    print(f"noise floor ±{floor:.2%}")
    aa = {v: 0 for v in (stats.FASTER, stats.SLOWER, stats.SAME, stats.AMBIGUOUS)}
    for t in range(args.aa):
        a, b = _pair(base, base, 2 * t, settings, devices)
        if t % 2:
            a, b = b, a
        aa[stats.compare(a, b, 0.95, floor).verdict] += 1
    false_share = (aa[stats.FASTER] + aa[stats.SLOWER]) / args.aa
    print(f"A/A: {aa}, false FASTER/SLOWER {false_share:.1%}")
    detection = {}
    for effect, reps in ((0.05, 21), (0.10, 22)):
        slower = repeated_matmul(reps)
        verdicts = {v: 0 for v in aa}
        for t in range(args.ab):
            pair = (base, slower) if t % 2 == 0 else (slower, base)
            x, y = _pair(*pair, 10_000 + 2 * t, settings, devices)
            fast, slow = (x, y) if t % 2 == 0 else (y, x)
            verdicts[stats.compare(fast, slow, 0.95, floor).verdict] += 1
        detection[f"{effect:.0%}"] = {
            "trials": args.ab, "verdicts": verdicts,
            "detected_share": verdicts[stats.FASTER] / args.ab,
            "floor_allows": effect > floor}
        print(f"A/B {effect:.0%}: {verdicts}")
    path = write("calibration", {
        "workload": f"{BASE_REPS} × 64×64 float64 matmul (numpy), hot",
        "settings": dataclasses.asdict(settings), "pinned_cpu": pinned,
        "noise_floor": floor, "aa_trials": args.aa, "aa_verdicts": aa,
        "aa_false_share": false_share, "ab": detection,
        "wall_s": time.perf_counter() - started,
        "targets": {"aa_false_share_max": 0.05, "detected_share_min": 0.95}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
