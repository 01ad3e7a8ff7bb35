"""The larger randomized run of the Mosaic GPU port (CI runs 4 examples per test run).

Draws problems across every mask type, head layout (MHA/GQA/MQA-like), head dims,
dtype, soft cap, segment ids, logsumexp and block_kv; runs each in the Mosaic GPU
interpreter with race detection and compares with the float64 oracle. Records every
draw and the worst error against tolerance in benchmarks/results/fuzz_mgpu.json.

    PYTHONPATH=workflow:. .venv/bin/python -m benchmarks.fuzz_mgpu [--examples 40]
"""

from __future__ import annotations

import argparse
import secrets
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.workloads import write
from casebook.verify import compare
from kernels import mgpu_interpret
from kernels.splash_attention import mgpu_forward, oracle_f64
from kernels.splash_attention.problems import MASK_KINDS, dense, inputs, mask_of, segments

# Against the float64 oracle, as in tests/test_mgpu_forward.py (reasons there).
TOL = {"float16": 3e-3, "bfloat16": 2e-2}
LAYOUTS = [(2, 2), (2, 1), (4, 2), (4, 1)]
DIMS = [(64, 64), (128, 64), (64, 128), (128, 128)]


def draw(rng: np.random.Generator) -> dict:
    return {"mask": str(rng.choice(MASK_KINDS)),
            "heads": [int(h) for h in LAYOUTS[rng.integers(len(LAYOUTS))]],
            "dims": [int(d) for d in DIMS[rng.integers(len(DIMS))]],
            "dtype": str(rng.choice(list(TOL))),
            "soft_cap": [None, 4.0][rng.integers(2)],
            "segment_ids": bool(rng.integers(2)), "lse": bool(rng.integers(2)),
            "block_kv": int(rng.choice([64, 128])), "stages": int(rng.choice([1, 2, 3]))}


def run_one(problem: dict, rng: np.random.Generator) -> dict:
    mask = mask_of(problem["mask"], problem["heads"][0], rng)
    q, k, v = inputs(rng, *problem["heads"], *problem["dims"], problem["dtype"])
    seg = segments(rng) if problem["segment_ids"] else None
    mgpu_interpret.reset_interpreter()
    start = time.perf_counter()
    got = jax.block_until_ready(mgpu_forward.splash_attention(
        mask, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), segment_ids=seg,
        soft_cap=problem["soft_cap"], return_lse=problem["lse"],
        config=mgpu_forward.TuningConfig(64, problem["block_kv"], problem["stages"]),
        interpret=mgpu_interpret.interpret_params(race_detection=True)))
    seconds = time.perf_counter() - start
    out = got[0] if problem["lse"] else got
    want = oracle_f64.attention(q, k, v, dense(mask), soft_cap=problem["soft_cap"],
                                segment_ids=None if seg is None else (seg.q, seg.kv))
    tol = TOL[problem["dtype"]]
    check = compare(np.asarray(out, np.float64), want, tol, tol)
    return {**problem, "seconds": seconds, "races_found": mgpu_interpret.races_found(),
            "passed": check["passed"] and not mgpu_interpret.races_found(),
            "worst_error_over_tolerance": check["worst_error_over_tolerance"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=40)
    args = parser.parse_args()
    seed = secrets.randbits(63)
    rng = np.random.default_rng(seed)
    runs = [run_one(draw(rng), rng) for _ in range(args.examples)]
    worst = [r["worst_error_over_tolerance"] for r in runs]
    summary = {"seed": seed, "examples": len(runs),
               "failed": sum(not r["passed"] for r in runs),
               "worst_error_over_tolerance": max((w for w in worst if w is not None),
                                                 default=None),
               "median_seconds": float(np.median([r["seconds"] for r in runs]))}
    path = write("fuzz_mgpu", {"target": "cpu (Mosaic GPU interpreter)", **summary,
                               "runs": runs})
    print(path, summary)


if __name__ == "__main__":
    main()
