"""How the splash forward's worst-case bound sees a 64-key error as S grows (issue 43).

At causal points of growing S (one head, d 128, bfloat16, inputs drawn as the case draws
them), for the last 64 query rows (those the ``partial_block_as_full`` and
``last_kv_block_skipped`` mutants change) and 64 drawn rows, in float64 on the host:

- the worst-case bound (``bounds.forward_rows``) plus the output's rounding, as the check
  allows;
- a correct execution's error: a float32 online-softmax forward emulated in numpy (kv
  blocks of 1024, P rounded to bfloat16 before P·V, float32 sums, out rounded);
- each mutant's error (its exact answer rounded to bfloat16), against the same bound;
- the same terms under a probabilistic model (each rounding error independent and
  mean-zero, Higham and Mary 2019): λ·√(Σ_j c_j²) for the per-key terms, λ·√(2n+2)·u for
  the float32 sums, where the worst case has Σ_j c_j and (2n+2)·u;
- the weights' errors taken over v's draw instead (given q and k they are fixed, and v's
  entries independent normals: a tail bound of the case's own input distribution, no
  model of rounding), the float32 sums worst case, over any order or over the blocked
  order of a kernel (1024 keys a block, then the blocks);
- the check's own (``bounds.forward_terms`` given ``v_sigma``): the smaller of the worst
  case and the bound over v with the float32 sums taken over v's draw too, in any order
  fixed before v is drawn (docs/splash-bounds.md has the argument);

λ as ``bounds.LAMBDA``.

Writes benchmarks/results/splash_bound_power.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from kernels.splash_attention import bounds, make_inputs

OUT = Path("benchmarks/results/splash_bound_power.json")
LAMBDA = bounds.LAMBDA
BLOCK = 64  # the mutants' mask block (near_misses.BLOCK)
KV_BLOCK = 1024  # the emulated execution's kv block (upstream's pick on the chip)
BF16 = ml_dtypes.bfloat16


def _seen(rows: np.ndarray, s: int, mutant: str | None) -> np.ndarray:
    """[rows, S] causal visibility, as the mutant changes it."""
    keys = np.arange(s)
    seen = keys[None] <= rows[:, None]
    if mutant == "partial_block_as_full":
        seen[rows >= s - BLOCK, s - BLOCK:] = True
    elif mutant == "last_kv_block_skipped":
        seen[:, s - BLOCK:] = False
    return seen


def _emulated(q, k, v, seen) -> np.ndarray:
    """A correct kernel's out in float32: online softmax over kv blocks, P rounded to
    bfloat16 before P·V, normalised at the end, rounded to bfloat16."""
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    peak = np.full(len(q), -np.inf, np.float32)
    total = np.zeros(len(q), np.float32)
    acc = np.zeros((len(q), v.shape[1]), np.float32)
    for b in range(0, k.shape[0], KV_BLOCK):
        s = np.where(seen[:, b:b + KV_BLOCK], q32 @ k32[b:b + KV_BLOCK].T, -np.inf)
        new = np.maximum(peak, s.max(axis=1))
        alpha = np.where(np.isinf(new), 0, np.exp(peak - new)).astype(np.float32)
        p = np.where(np.isinf(s), 0, np.exp(s - new[:, None])).astype(np.float32)
        total = total * alpha + p.sum(axis=1, dtype=np.float32)
        acc = acc * alpha[:, None] + p.astype(BF16).astype(np.float32) @ v32[b:b + KV_BLOCK]
        peak = new
    return (acc / total[:, None]).astype(BF16).astype(np.float64)


def _higham_mary(v, seen, p, out, eta) -> np.ndarray:
    """The bound's terms with every sum of per-key errors taken as √(Σ c_j²) times λ."""
    u_p, u_32 = bounds.UNIT["bfloat16"], bounds.F32
    n = seen.sum(axis=1)[:, None]
    mag = np.abs(v)
    t1 = np.sqrt(((p * eta) ** 2) @ mag**2 + out**2 * ((p * eta) ** 2).sum(axis=1)[:, None])
    t2 = u_p * np.sqrt((p**2) @ mag**2 + out**2 * (p**2).sum(axis=1)[:, None])
    t3 = LAMBDA * np.sqrt(2 * n + 2) * u_32 * (p @ mag + np.abs(out))
    return LAMBDA * (t1 + t2) + t3


def _over_v(v, seen, p, out, eta, summed: int | None) -> np.ndarray:
    """The weights' errors (logits, exp, P's rounding) depend on q and k alone: given
    them, their effect Σ_j c_j v_j is a sum of independent bfloat16-rounded normals, past
    λ·√(Σ c_j²) with probability 2e^(−λ²/2) over v; the float32 sums stay worst case,
    over ``summed`` terms a row (None: any order, 2n + 2, as ``bounds``)."""
    u_p, n = bounds.UNIT["bfloat16"], seen.sum(axis=1)[:, None]
    sigma = bounds.SIGMA
    t1 = LAMBDA * sigma * np.sqrt(((p * eta) ** 2).sum(axis=1))[:, None] \
        + np.abs(out) * (p * eta).sum(axis=1)[:, None]
    t2 = LAMBDA * sigma * u_p * np.sqrt((p**2).sum(axis=1))[:, None] + u_p * np.abs(out)
    terms = 2 * n + 2 if summed is None else summed
    t3 = bounds.gamma(terms) * (p @ np.abs(v) + np.abs(out))
    return t1 + t2 + t3


def point(s: int, rng: np.random.Generator) -> dict:
    params = {"heads_q": 1, "heads_kv": 1, "seq_len": s, "head_dim": 128,
              "dtype": "bfloat16"}
    inputs = make_inputs(params, rng)
    q, k, v = (inputs[n][0].astype(np.float64) for n in ("q", "k", "v"))
    rows = np.concatenate([np.sort(rng.choice(s - BLOCK, BLOCK, replace=False)),
                           np.arange(s - BLOCK, s)])
    seen = _seen(rows, s, None)
    found = bounds.forward_terms(q[rows], k, v, seen, None, "bfloat16",
                                 sigma=bounds.v_sigma(inputs["v"]))
    p, out, eta = found["p"], found["out"], found["eta"]
    rounding = bounds.UNIT["bfloat16"] * np.abs(out)
    blocked = KV_BLOCK + 2 * s // KV_BLOCK + 2  # within a block, then across blocks
    allowed = {"worst case": found["worst_bound"] * (1 + bounds.UNIT["bfloat16"]) + rounding,
               "Higham-Mary": _higham_mary(v, seen, p, out, eta) + rounding,
               "over v": _over_v(v, seen, p, out, eta, None) + rounding,
               "over v, blocked sums": _over_v(v, seen, p, out, eta, blocked) + rounding,
               "the check's": found["bound"] * (1 + bounds.UNIT["bfloat16"]) + rounding}
    errors = {"correct (emulated)": np.abs(_emulated(q[rows], k, v, seen) - out)}
    for mutant in ("partial_block_as_full", "last_kv_block_skipped"):
        wrong = bounds.forward_rows(q[rows], k, v, _seen(rows, s, mutant), None,
                                    "bfloat16")[0]
        errors[mutant] = np.abs(wrong.astype(BF16).astype(np.float64) - out)
    return {name: {bound: float((error / allowed[bound]).max()) for bound in allowed}
            for name, error in errors.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+",
                        default=[4096, 8192, 16384, 32768])
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy
                                                       % 2**63)
    rng = np.random.default_rng(seed)
    started = time.monotonic()
    found = {str(s): [point(s, rng) for _ in range(args.draws)] for s in args.seq_lens}
    record = {"what": __doc__.splitlines()[0], "seed": seed, "lambda": LAMBDA,
              "kv_block": KV_BLOCK, "rows": "the last 64 and 64 drawn, one head, d 128",
              "worst_error_over_allowed": found,
              "seconds": round(time.monotonic() - started, 1)}
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.rename(OUT)
    for s, draws in found.items():
        for bound in draws[0]["correct (emulated)"]:
            print(s, bound, *(f"{name}: " + " ".join(f"{d[name][bound]:.3g}" for d in draws)
                              for name in draws[0]), sep=" | ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
