"""The larger randomized run of case 01's kernels (CI runs one draw per configuration).

1. The masked grouped GEMM on problems the model says are exact in f32 (random codes,
   scales in [1, 2), K <= 512), every tiling and the persistent schedule, random
   experts, rows, masked_m (with an expert at 0 rows): bit-exact or not, per draw;
2. every variant of the case through its plug-in at random small MoE layers, against
   the oracle (codes tie-aware, values against their bounds).
All in the Mosaic GPU interpreter with race detection. Records every draw in
benchmarks/results/fuzz_moe_nvfp4.json.

    .venv/bin/python -m benchmarks.fuzz_moe_nvfp4 [--draws 3]
"""

from __future__ import annotations

import argparse
import secrets
import time

import ml_dtypes
import numpy as np

from benchmarks.workloads import write
from casebook.core import cases, config, paths
from casebook.stages import verify
from kernels import mgpu_interpret
from kernels.moe_nvfp4 import layouts, mgpu_gemm, oracle_f64, port, problems

GEMMS = [mgpu_gemm.TuningConfig(64, 64, 2), mgpu_gemm.TuningConfig(128, 128, 3),
         mgpu_gemm.TuningConfig(64, 128, 4), mgpu_gemm.TuningConfig(128, 128, 2, 3)]


def exact_gemm(config: mgpu_gemm.TuningConfig, rng: np.random.Generator) -> dict:
    e = int(rng.integers(1, 4))
    m, n = 128 * int(rng.integers(1, 3)), 128 * int(rng.integers(1, 3))
    k = 256 * int(rng.integers(1, 3))
    a = problems.quantized(rng, e, m, k, exact=True)
    b = problems.quantized(rng, e, n, k, exact=True)
    masked = problems.masked_m(rng, e, m)
    alpha = rng.uniform(0.1, 2, e).astype(np.float32)
    mgpu_interpret.reset_interpreter()
    start = time.perf_counter()
    fn = mgpu_gemm.make(mgpu_gemm.Problem(e, m, n, k), config,
                        interpret=mgpu_interpret.interpret_params(race_detection=True))
    out = np.asarray(fn(a[0], a[1], *layouts.k_pair_major(b[0], b[1]), alpha, masked),
                     np.float64)
    seconds = time.perf_counter() - start
    want = oracle_f64.masked_gemm(a[0], a[1], b[0], b[1], alpha, masked)
    want = want.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    valid = oracle_f64.valid_rows(masked, m)
    return {"config": repr(config), "shape": [e, m, n, k], "masked_m": masked.tolist(),
            "exact_condition": oracle_f64.sum_is_exact_in_f32(a[0], a[1], b[0], b[1]),
            "bit_exact": bool(np.array_equal(out[valid], want[valid])),
            "untouched": bool(np.isnan(out[~valid]).all()),
            "races_found": mgpu_interpret.races_found(), "seconds": seconds}


def variant_draw(name: str, rng: np.random.Generator, spec: dict) -> dict:
    moe = cases.load("moe_nvfp4")
    params = {"experts": int(rng.integers(1, 4)), "m": 128,
              "hidden": 256 * int(rng.integers(1, 3)), "inter": 256, "dtype": "nvfp4"}
    inputs = moe.make_inputs(params, rng)
    moe.reset()
    start = time.perf_counter()
    runnable = moe.kernel(name, params, "check")
    got = runnable.fetch(runnable.call(*runnable.prepare(inputs)))
    seconds = time.perf_counter() - start
    check = verify.check_outputs(
        params, inputs, got, moe.oracle(params, inputs),
        lambda output: config.tolerance(spec, "nvfp4", output, "moe_nvfp4.yaml"), moe.compare,
        runnable.execution["poisoned"])
    return {"variant": name, "params": params, "masked_m": inputs["masked_m"].tolist(),
            "passed": check["passed"] and not moe.races_found(),
            "outputs": {k: {f: v.get(f) for f in ("passed", "worst_error_over_tolerance",
                                                  "codes_at_ties", "either_way_fraction")}
                        for k, v in check["outputs"].items()},
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=3, help="per configuration/variant")
    args = parser.parse_args()
    seed = secrets.randbits(63)
    rng = np.random.default_rng(seed)
    spec = config.load_case(paths.SOURCE_ROOT / "configs/cases", "moe_nvfp4")
    gemms = [exact_gemm(c, rng) for c in GEMMS for _ in range(args.draws)]
    # The Blackwell variants are lowered only: no interpreter runs tcgen05 (recorded).
    ran = [v for v, config_ in port.VARIANTS.items() if config_.arch == "sm_90a"]
    runs = [variant_draw(v, rng, spec) for v in ran for _ in range(args.draws)]
    summary = {
        "seed": seed,
        "exact_gemm_draws": len(gemms),
        "exact_gemm_bit_exact": sum(g["bit_exact"] and g["exact_condition"] for g in gemms),
        "exact_gemm_untouched_and_race_free": sum(g["untouched"] and not g["races_found"]
                                                  for g in gemms),
        "variant_draws": len(runs), "variant_failed": sum(not r["passed"] for r in runs),
        "median_seconds_gemm": float(np.median([g["seconds"] for g in gemms])),
        "not_run": {v: "lowered only: a Blackwell (sm_100a) kernel, which no interpreter "
                       "runs" for v in port.VARIANTS if v not in ran},
    }
    path = write("fuzz_moe_nvfp4", {"target": "cpu (Mosaic GPU interpreter)", **summary,
                                    "gemms": gemms, "runs": runs})
    print(path, summary)


if __name__ == "__main__":
    main()
