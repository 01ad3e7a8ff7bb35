"""The larger randomized run of the Mosaic GPU port, forward and backward (CI runs a few
examples of each per test run).

Draws problems across every mask type, head layout (MHA/GQA/MQA-like), head dims,
dtype, soft cap, segment ids, logsumexp and tile choices; runs each through the port's
VJP (forward kernel, then dQ and dK/dV kernels) in the Mosaic GPU interpreter with race
detection and NaN shared memory, and compares out (and logsumexp) with the float64
oracle and dq/dk/dv with float64 autodiff of the dense reference. Records every draw,
the worst error against tolerance per output and per variant (``mgpu``: forward, partial
blocks from the mask function on iota; ``mgpu_mask_tiles``: forward, from MaskInfo's
tiles; ``mgpu_bwd``: dq, dk, dv) as a ``randomized_check`` record in
benchmarks/results/fuzz_mgpu.json, which the splash attention page cites.

    .venv/bin/python -m benchmarks.fuzz_mgpu [--examples 40]
"""

from __future__ import annotations

import argparse
import platform
import secrets
import time

import jax
import jax.numpy as jnp
import numpy as np

from casebook.core import config, records
from casebook.core.paths import SOURCE_ROOT
from casebook.stages.verify import compare
from kernels import mgpu_interpret
from kernels.splash_attention import (
    bounds,
    mgpu_autodiff,
    mgpu_backward,
    mgpu_forward,
    oracle_f64,
    oracle_vjp,
)
from kernels.splash_attention.problems import (
    DTYPE,
    LSE_TOLERANCE,
    MASK_KINDS,
    dense,
    inputs,
    mask_of,
    segments,
)

# The case config's tolerances (configs/cases/splash_attention.yaml, with their reasons);
# out and the gradients are held to the bound a correct execution keeps to
# (kernels/splash_attention/bounds.py) plus those; logsumexp's is problems.LSE_TOLERANCE.
TOL = {dtype: {name: config.shipped_tolerance("splash_attention", dtype, name)
               for name in ("out", "dq", "dk", "dv")} for dtype in ("float16", "bfloat16")}
LAYOUTS = [(2, 2), (2, 1), (4, 2), (4, 1)]
DIMS = [(64, 64), (128, 64), (64, 128), (128, 128)]
INDEX_FUNCTION_MASKS = ("causal", "causal_offset", "local", "chunked", "full")


def draw(rng: np.random.Generator) -> dict:
    return {"mask": str(rng.choice(MASK_KINDS)),
            "heads": [int(h) for h in LAYOUTS[rng.integers(len(LAYOUTS))]],
            "dims": [int(d) for d in DIMS[rng.integers(len(DIMS))]],
            "dtype": str(rng.choice(list(TOL))),
            "soft_cap": [None, 4.0][rng.integers(2)],
            "segment_ids": bool(rng.integers(2)), "lse": bool(rng.integers(2)),
            "block_kv": int(rng.choice([64, 128])), "stages": int(rng.choice([1, 2, 3])),
            "compute_wgs": int(rng.choice([1, 2])),
            "bwd_blocks": [int(b) for b in [(64, 64), (128, 64), (64, 128)][rng.integers(3)]],
            "bwd_stages": int(rng.choice([1, 2]))}


def run_one(problem: dict, rng: np.random.Generator) -> dict:
    mask = mask_of(problem["mask"], problem["heads"][0], rng)
    q, k, v = (jnp.asarray(x) for x in inputs(rng, *problem["heads"], *problem["dims"],
                                               problem["dtype"]))
    dv = problem["dims"][1]
    do = (rng.standard_normal((problem["heads"][0], q.shape[1], dv)) / np.sqrt(dv)).astype(
        DTYPE[problem["dtype"]])
    seg = segments(rng) if problem["segment_ids"] else None
    segment_ids = None if seg is None else (seg.q, seg.kv)
    config = mgpu_forward.TuningConfig(64 * problem["compute_wgs"], problem["block_kv"],
                                       problem["stages"], problem["compute_wgs"])
    interpret = mgpu_interpret.interpret_params(race_detection=True)
    mgpu_interpret.reset_interpreter()
    start = time.perf_counter()
    forward = jax.block_until_ready(mgpu_forward.splash_attention(
        mask, q, k, v, segment_ids=seg, soft_cap=problem["soft_cap"],
        return_lse=problem["lse"], config=config, interpret=interpret))
    out, vjp = jax.vjp(lambda q, k, v: mgpu_autodiff.splash_attention(
        mask, q, k, v, segment_ids=seg, soft_cap=problem["soft_cap"], config=config,
        bwd_config=mgpu_backward.BackwardConfig(*problem["bwd_blocks"], problem["bwd_stages"]),
        interpret=interpret), q, k, v)
    grads = jax.block_until_ready(vjp(jnp.asarray(do)))
    seconds = time.perf_counter() - start
    races = mgpu_interpret.races_found()
    want = oracle_vjp.gradients(q, k, v, do, dense(mask), segment_ids=segment_ids,
                                   soft_cap=problem["soft_cap"])
    tol = TOL[problem["dtype"]]
    visible = dense(mask) if seg is None else dense(mask) & (seg.q[:, None] == seg.kv[None, :])
    checks = bounds.dense_check(
        {"out": forward[0] if problem["lse"] else forward, "dq": grads[0], "dk": grads[1],
         "dv": grads[2]}, dict(zip(("out", "dq", "dk", "dv"), want, strict=True)),
        {"q": q, "k": k, "v": v, "do": do}, visible, problem["soft_cap"], tol.__getitem__)
    checks["out_vjp"] = bounds.dense_check({"out": out}, {"out": want[0]}, {"q": q, "k": k,
                                           "v": v}, visible, problem["soft_cap"],
                                           tol.__getitem__)["out"]
    if problem["lse"]:
        _, want_lse = oracle_f64.attention(q, k, v, dense(mask), segment_ids=segment_ids,
                                           soft_cap=problem["soft_cap"], return_lse=True)
        seen = ~np.isneginf(want_lse)
        got_lse = np.asarray(forward[1], np.float64)
        checks["lse"] = compare(np.where(seen, got_lse, 0.0), np.where(seen, want_lse, 0.0),
                                LSE_TOLERANCE, LSE_TOLERANCE)
    return {**problem, "path": ("mgpu" if problem["mask"] in INDEX_FUNCTION_MASKS
                                else "mgpu_mask_tiles"),
            "seconds": seconds, "races_found": races,
            "passed": all(c["passed"] for c in checks.values()) and not races,
            "worst_error_over_tolerance": {n: c["worst_error_over_tolerance"]
                                           for n, c in checks.items()}}


RECORD = "benchmarks/results/fuzz_mgpu.json"
EXECUTION = ("Pallas Mosaic GPU interpret mode on the host CPU (race detection on, "
             "uninitialised shared memory NaN)")
VARIANT_OUTPUTS = {"mgpu": ("out", "lse"), "mgpu_mask_tiles": ("out", "lse"),
                   "mgpu_bwd": ("dq", "dk", "dv")}


def worst(runs: list[dict], output: str) -> float | None:
    values = [r["worst_error_over_tolerance"].get(output) for r in runs]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def summarise(runs: list[dict]) -> dict:
    """Totals, and per variant: forward runs by mask path, the backward over all runs."""
    def variant(name: str) -> dict:
        sub = runs if name == "mgpu_bwd" else [r for r in runs if r["path"] == name]
        outputs = VARIANT_OUTPUTS[name]
        return {"examples": len(sub),
                "failed": sum(any((r["worst_error_over_tolerance"].get(o) or 0) > 1
                                  for o in outputs) or r["races_found"] for r in sub),
                "worst_error_over_tolerance": {o: worst(sub, o) for o in outputs}}

    return {"examples": len(runs), "failed": sum(not r["passed"] for r in runs),
            "races": sum(r["races_found"] for r in runs),
            "worst_error_over_tolerance": {o: worst(runs, o)
                                           for o in ("out", "lse", "dq", "dk", "dv")},
            "per_variant": {name: variant(name) for name in VARIANT_OUTPUTS},
            "median_seconds": float(np.median([r["seconds"] for r in runs]))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--seed", type=int, default=None, help="replay a recorded run")
    args = parser.parse_args()
    mgpu_interpret.start_host_backend()
    seed = secrets.randbits(63) if args.seed is None else args.seed
    print("seed", seed, flush=True)
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(args.examples):
        problem = draw(rng)
        print(i, problem, flush=True)
        runs.append(run_one(problem, rng))
        print(i, runs[-1]["passed"], runs[-1]["worst_error_over_tolerance"], flush=True)
    summary = summarise(runs)
    records.write(SOURCE_ROOT / RECORD, "randomized_check", {
        "case": "splash_attention", "runner": "benchmarks/fuzz_mgpu.py",
        "execution": EXECUTION, "seed": seed, **summary,
        "check": "out, dq, dk and dv: each element within the bound a correct execution "
                 "keeps to (kernels/splash_attention/bounds.py) plus the tolerances' atol "
                 "and rtol; logsumexp within its tolerance",
        "tolerances": {**{dtype: {name: {"atol": atol, "rtol": rtol}
                                  for name, (atol, rtol) in by_output.items()}
                          for dtype, by_output in TOL.items()},
                       "lse": LSE_TOLERANCE},
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "runs": runs})
    print(RECORD, summary)


if __name__ == "__main__":
    main()
