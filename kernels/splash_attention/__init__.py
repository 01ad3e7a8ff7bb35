"""Case 02, splash attention: the surface the pipeline calls (kernels.contract).

Variants: ``upstream``, JAX's TPU kernel lowered for TPU (on any host) and run on a TPU,
or elsewhere by Pallas's interpreter on the host (the reference), and ``upstream_bwd``,
its backward (dq, dk, dv through upstream's own custom VJP) run the same way; ``mgpu`` and
``mgpu_mask_tiles``, the Pallas Mosaic GPU port's forward (see ``port``), and
``mgpu_bwd``, its backward (dq, dk, dv through the port's custom VJP), lowered for CUDA
sm_90a and run by the Mosaic GPU interpreter on a CPU host; ``mgpu_sm100a`` and
``mgpu_sm100a_mask_tiles``, the forward for Blackwell, lowered for sm_100a and run only
on a Blackwell GPU (no interpreter runs tcgen05 or tensor memory).

Outputs (named): the forward variants return ``out``; the backward variants (``*_bwd``)
return ``dq``, ``dk``, ``dv`` for the cotangent ``do`` drawn with the inputs. The oracle
answers all four: densely below ROWS_FROM_SEQ_LEN, from SAMPLED_ROWS query rows and as
many key rows above it (``oracle_rows``), drawn when the oracle runs, after the kernel;
there every element is also checked against a float32 reference on the device
(``oracle_f32``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kernels import contract, mgpu_interpret
from kernels.contract import SINGLE_OUTPUT, Runnable
from kernels.runnable import from_jax
from kernels.splash_attention import (
    ablations,
    baselines,
    bounds,
    builds,
    masks,
    near_misses,
    oracle_f32,
    oracle_f64,
    oracle_rows,
    oracle_vjp,
    port,
    upstream,
)

INPUTS = ("q", "k", "v")
BACKWARD_INPUTS = ("q", "k", "v", "do")
UPSTREAM_VARIANTS = ("upstream", "upstream_bwd")
VARIANTS = (*UPSTREAM_VARIANTS, *port.VARIANTS)
# The backward variants read BACKWARD_INPUTS and return GRADIENTS; the rest return out.
BACKWARD_VARIANTS = ("upstream_bwd", *port.GRADIENT_VARIANTS)
GRADIENTS = oracle_f32.GRADIENTS
DTYPES = {"float32": np.float32, "float16": np.float16}
# From this length the dense oracle's [H, S, S] float64 arrays (2 GiB a head group at S
# 4096, H 16, and several of them for autodiff) give way to sampled rows: a query row's
# out and dq cost O(S·d), a key row's dk and dv need its group's query statistics, O(S²·d)
# a query head of the kv heads sampled, once per check (oracle_rows.KEY_HEADS).
ROWS_FROM_SEQ_LEN = 2048
SAMPLED_ROWS = 64


def make_inputs(params: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh q, k, v and a cotangent do; q carries the 1/sqrt(D) scale (splash applies none
    inside) and do 1/sqrt(D), so dO·Vᵀ has unit scale like Q·Kᵀ."""
    import ml_dtypes

    dtype = {**DTYPES, "bfloat16": ml_dtypes.bfloat16}[params["dtype"]]
    s, d = params["seq_len"], params["head_dim"]
    # Drawn in float32 (half the time of float64 at S 32768; every dtype the kernels take
    # is at most float32, so the rounded inputs lose nothing).
    scale = np.float32(1 / np.sqrt(d))

    def normal(heads: int) -> np.ndarray:
        return rng.standard_normal((heads, s, d), dtype=np.float32)

    q, k, v = normal(params["heads_q"]) * scale, normal(params["heads_kv"]), normal(
        params["heads_kv"])
    do = normal(params["heads_q"]) * scale
    return {name: x.astype(dtype) for name, x in (("q", q), ("k", k), ("v", v), ("do", do))}


def oracle(params: dict[str, Any], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 answers for exactly these (already rounded) inputs: ``out`` from the
    numpy oracle, ``dq``, ``dk``, ``dv`` by float64 autodiff of the dense reference; from
    ROWS_FROM_SEQ_LEN on, those of rows drawn now (``sampled_oracle``)."""
    if params["seq_len"] >= ROWS_FROM_SEQ_LEN:
        return sampled_oracle(params, inputs, secrets.randbits(63))
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    ids = masks.segment_ids(params)
    segments = None if ids is None else (ids, ids)
    mask, cap = masks.dense_mask(params), params.get("soft_cap")
    out = oracle_f64.attention(q, k, v, mask, segment_ids=segments, soft_cap=cap)
    _, dq, dk, dv = oracle_vjp.gradients(q, k, v, inputs["do"], mask,
                                            segment_ids=segments, soft_cap=cap)
    return {"out": out, "dq": dq, "dk": dk, "dv": dv}


def sampled_oracle(params: dict[str, Any], inputs: dict[str, np.ndarray], seed: int,
                   count: int = SAMPLED_ROWS) -> dict[str, contract.SampledRows]:
    """The exact float64 ``out`` and ``dq`` of ``count`` query rows and ``dk``, ``dv`` of
    ``count`` key rows (of ``oracle_rows.KEY_HEADS`` kv heads) drawn from ``seed``, each
    computed only when a check reads it."""
    picked = oracle_rows.sample(params, np.random.default_rng(seed), count)
    at_queries = (picked["query_heads"], picked["query_rows"])
    at_keys = (picked["kv_heads"], picked["key_rows"])
    found: dict[str, dict[str, np.ndarray]] = {}

    def queries() -> dict[str, np.ndarray]:
        if "queries" not in found:
            found["queries"] = oracle_rows.query_rows(params, inputs, *at_queries)
        return found["queries"]

    def keys() -> dict[str, np.ndarray]:
        if "keys" not in found:
            stats = oracle_rows.statistics(params, inputs, kv_heads=at_keys[0])
            found["keys"] = oracle_rows.key_rows(params, inputs, stats, *at_keys)
        return found["keys"]

    def whole(output: str) -> Callable[[], tuple[Any, Any, Any]]:
        def reference() -> tuple[Any, Any, Any]:
            gradients = output in GRADIENTS
            if "whole" not in found or (gradients and "dq" not in found["whole"]):
                found["whole"] = oracle_f32.references(params, inputs, gradients)
            return tuple(found["whole"][f"{output}{part}"]
                         for part in ("", "_bound", "_own_bound"))
        return reference

    q_shape, kv_shape = inputs["q"].shape, inputs["k"].shape
    out_shape = (*q_shape[:2], inputs["v"].shape[2])
    return {"out": Sampled(out_shape, at_queries, lambda: queries()["out"], seed, whole("out")),
            "dq": Sampled(q_shape, at_queries, lambda: queries()["dq"], seed, whole("dq")),
            "dk": Sampled(kv_shape, at_keys, lambda: keys()["dk"], seed, whole("dk")),
            "dv": Sampled((*kv_shape[:2], inputs["v"].shape[2]), at_keys,
                          lambda: keys()["dv"], seed, whole("dv"))}


class Sampled(contract.SampledRows):
    """The float64 oracle's sampled rows, and ``whole()``: the float32 reference of every
    element, the kernel's bound and the reference's own, on the device (``oracle_f32``),
    computed on first use and kept while this answer is (one pass serves dq, dk and dv)."""

    def __init__(self, shape: tuple[int, ...], index: tuple[np.ndarray, ...],
                 values: Callable[[], np.ndarray], seed: int,
                 whole: Callable[[], tuple[Any, Any, Any]]):
        super().__init__(shape, index, values, seed)
        self.whole = whole


def compare(params: dict[str, Any], inputs: dict[str, np.ndarray], output: str,
            got: np.ndarray, want: np.ndarray | contract.SampledRows,
            tolerance: dict[str, Any], poisoned: bool = False,
            outputs: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Each element within the bound a correct execution keeps to (``bounds``), computed
    from these inputs for the rows checked, plus the config's atol and its rtol (the
    output's own rounding); NaN never passes (poison changes nothing: every element of
    every output is written)."""
    got = np.asarray(got)
    sampled = isinstance(want, contract.SampledRows)
    if got.shape != tuple(want.shape if sampled else np.shape(want)):
        shape = want.shape if sampled else np.shape(want)
        return bounds.compare(got, np.zeros(shape), np.zeros(shape), 0.0, 0.0)
    derived = tolerance.get("derived_bound", True)  # false: atol and rtol alone
    if not sampled:
        expected = np.asarray(want, np.float64)
        if derived and output == "dq":
            return bounds.along_d(got, expected, *_dq_parts(params, inputs, None),
                                  tolerance["atol"], tolerance["rtol"])
        bound = (_bounds(params, inputs, output, None) if derived
                 else np.zeros(expected.shape))
        return bounds.compare(got, expected, bound, tolerance["atol"], tolerance["rtol"])
    checked, expected = got[want.index], want.values()
    unwritten = int(np.count_nonzero(~np.isfinite(got.astype(np.float64)))
                    - np.count_nonzero(~np.isfinite(checked.astype(np.float64))))
    sample = {"rows": want.rows, "of": want.total, "seed": want.seed}
    whole = want.whole() if derived and isinstance(want, Sampled) else None
    if derived and output == "dq":
        found = bounds.along_d(checked, expected, *_dq_parts(params, inputs, want.index),
                               tolerance["atol"], tolerance["rtol"], sample, unwritten)
    else:
        bound = (np.zeros(expected.shape) if not derived else
                 _bounds(params, inputs, output, want.index) if whole is None
                 or output == SINGLE_OUTPUT else
                 np.asarray(whole[1][want.index], np.float64) * oracle_f32.SLACK)
        found = bounds.compare(checked, expected, bound, tolerance["atol"],
                               tolerance["rtol"], sample, unwritten)
    if whole is None:
        return found
    differs = _sampled_bound(params, inputs, output, want.index, whole[1])
    if differs:
        return {**found, "passed": False, "error": differs}
    every = oracle_f32.check(got, *whole, tolerance["atol"], tolerance["rtol"])
    worst = [found["worst_error_over_tolerance"], every.get("worst_error_over_tolerance")]
    return {**found, "every_element": {**every, "reference": oracle_f32.described()},
            "sampled": {**sample, "worst_error_over_tolerance": worst[0]},
            "passed": found["passed"] and every["passed"],
            "worst_error_over_tolerance": None if None in worst else max(worst)}


def _sampled_bound(params: dict[str, Any], inputs: dict[str, np.ndarray], output: str,
                   rows: tuple[np.ndarray, ...], on_device: Any) -> str:
    """Why the device's bound cannot be trusted ("" if it can). Query rows (out, dq) cost
    O(S·d) each in float64: the device's bound there is held to float64's within
    oracle_f32.SLACK (the device evaluates the same formulas in float32). Key rows (dk,
    dv) cost O(S²·d) a kv head in float64, minutes at S 32768 on a host: they are judged
    by the device's own bound, times SLACK (``compare``)."""
    if output not in (SINGLE_OUTPUT, "dq"):
        return ""
    ratio = np.asarray(on_device[rows], np.float64) / _bounds(params, inputs, output, rows)
    if ratio.min() * oracle_f32.SLACK < 1 or ratio.max() > oracle_f32.SLACK:
        return (f"the device's float32 bound of {output} at the sampled rows is "
                f"{ratio.min():.4g}-{ratio.max():.4g}× float64's, beyond "
                f"{oracle_f32.SLACK:g}: its every-element check cannot be trusted")
    return ""


_LAST: list = []  # [inputs, rows, found]: dq, dk, dv of one check share one pass


def _bounds(params: dict[str, Any], inputs: dict[str, np.ndarray], output: str,
            rows: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """``output``'s bound (``bounds``) at every element (``rows`` None) or at ``rows``
    (query rows of out and dq, key rows of dk and dv)."""
    if output == SINGLE_OUTPUT:
        return (bounds.out_bound(params, inputs) if rows is None
                else bounds.rows_bound(params, inputs, *rows))[1]
    return _gradient_terms(params, inputs, output, rows)[f"{output}_bound"]


def _dq_parts(params: dict[str, Any], inputs: dict[str, np.ndarray],
              rows: tuple[np.ndarray, np.ndarray] | None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dq's bound without D's error, D's direction and the largest shift along it, at
    every row (``rows`` None) or at ``rows`` (``bounds.along_d``)."""
    found = _gradient_terms(params, inputs, "dq", rows)
    return found["dq_free_bound"], found["dq_direction"], found["dq_shift"]


def _gradient_terms(params: dict[str, Any], inputs: dict[str, np.ndarray], output: str,
                    rows: tuple[np.ndarray, np.ndarray] | None) -> dict[str, np.ndarray]:
    """``bounds.gradient_bounds`` at every row or at ``rows``, kept for the next output
    of the same check."""
    if output not in GRADIENTS:
        raise ValueError(f"splash_attention has no output {output!r}")
    key = None if rows is None else (output == "dq", rows)
    if not (_LAST and _LAST[0] is inputs and _same(_LAST[1], key)):
        none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        found = (bounds.every_gradient_bound(params, inputs) if rows is None else
                 bounds.gradient_bounds(params, inputs, rows if output == "dq" else none,
                                        none if output == "dq" else rows))
        _LAST[:] = [inputs, key, found]
    return _LAST[2]


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1], strict=True))


def model_outputs(params: dict[str, Any], inputs: dict[str, np.ndarray],
                  want: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a correct kernel writes: the oracle's ``out``, ``dq``, ``dk``, ``dv`` rounded
    to the input dtype, the dtype of every output of the port; where the oracle answers
    sampled rows, the float32 reference of every element on the device (``oracle_f32``,
    itself a correct execution: float32 throughout) so rounded."""
    return {name: near_misses.rounded(inputs, want[name].whole()[0]
                                      if isinstance(want[name], Sampled) else want[name])
            for name in (SINGLE_OUTPUT, *GRADIENTS)}


def mutants(params: dict[str, Any]):
    """Near misses of out, dq, dk, dv (``near_misses``) that the check must catch."""
    return near_misses.mutants(params)


def check_params(params: dict[str, Any]) -> tuple[str, str] | None:
    """Why the kernel cannot run ``params`` (the key and what is wrong), or None."""
    if params["heads_q"] % params["heads_kv"]:
        return "heads_kv", (f"{params['heads_kv']} does not divide heads_q={params['heads_q']}"
                            " (heads_q must be a multiple of heads_kv)")
    for variant, key in upstream.TUNED_KEYS.items():
        if params["seq_len"] % upstream.block(params, variant):
            named = key if key in params else "block"
            return "seq_len", (f"{params['seq_len']} is not a multiple of {variant}'s block "
                               f"{upstream.block(params, variant)} ({named})")
    if params.get("segments", 1) > params["seq_len"]:
        return "segments", f"{params['segments']} exceed seq_len={params['seq_len']}"
    return None


def outputs(variant: str) -> tuple[str, ...]:
    """What ``kernel(variant, ...)`` fetches: the gradients for a backward variant, the
    attention output (one array) for a forward one."""
    _check_variant(variant)
    return GRADIENTS if variant in BACKWARD_VARIANTS else (SINGLE_OUTPUT,)


def baseline_outputs(name: str) -> tuple[str, ...]:
    """Every baseline is a forward attention: the output, one array."""
    if name not in baselines.BASELINES:
        raise ValueError(f"unknown splash_attention baseline {name!r}; known: "
                         f"{sorted(baselines.BASELINES)}")
    return (SINGLE_OUTPUT,)


def build(variant: str, params: dict[str, Any], build_dir: Path | None = None
          ) -> dict[str, Any]:
    """Lower the kernel: the port for CUDA (sm_90a, or sm_100a for Blackwell); upstream
    for TPU (Mosaic) and, in its interpreted form, for the host."""
    import jax

    if variant in ablations.ABLATIONS:
        return builds.build_ablation(variant, params)
    _check_variant(variant)
    if variant in port.VARIANTS:
        return builds.build(variant, params)
    shapes = builds.arg_shapes(params)
    make = upstream.make
    if variant == "upstream_bwd":
        shapes, make = (*shapes, shapes[0]), upstream.make_backward  # do is shaped like q
    start = time.perf_counter()
    tpu = jax.jit(make(params, interpret=False)).trace(*shapes).lower(
        lowering_platforms=("tpu",)).as_text()
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    jax.jit(make(params, interpret=True)).trace(*shapes).lower().compile()
    compile_s = time.perf_counter() - start
    table = upstream.block_table(params, variant)
    return {
        "artifacts": [
            {"target": "tpu", "kind": "Mosaic TPU module (lowered, not run)",
             "seconds": lower_s, "facts": {
                 "mosaic_custom_calls": tpu.count("tpu_custom_call"),
                 "stablehlo_bytes": len(tpu)}},
            {"target": "host", "kind": "interpreted kernel compiled by XLA for the host",
             "seconds": compile_s, "facts": {}},
        ],
        "block_census": upstream.block_census(table),
        "block_table_heads": int(table.shape[0]),
        "block": upstream.block(params, variant),
    }


def kernel(variant: str, params: dict[str, Any], purpose: str,
           build_dir: Path | None = None) -> Runnable:
    """The kernel to ``check`` or to ``time``: the port on a GPU of its architecture, or
    (sm_90a only) in the Mosaic GPU interpreter on a host without a GPU (checking: NaN
    memory, races); upstream on a TPU itself, elsewhere in Pallas's TPU interpreter. An
    ablation (``ablations``) runs as its variant does."""
    if variant in ablations.ABLATIONS:
        interpret, execution = mgpu_interpret.placement(purpose, "sm_90a")
        return from_jax(port.make_ablation(variant, params, interpret=interpret), INPUTS,
                        execution)
    _check_variant(variant)
    backward = variant in BACKWARD_VARIANTS
    names = BACKWARD_INPUTS if backward else INPUTS
    if variant in port.VARIANTS:
        interpret, execution = mgpu_interpret.placement(purpose, port.arch(variant))
        fn = (port.make_backward(variant, params, interpret=interpret) if backward
              else port.make(variant, params, interpret=interpret))
        return from_jax(fn, names, execution)
    make = upstream.make_backward if backward else upstream.make
    if upstream.on_tpu():
        return from_jax(make(params, interpret=False), names, contract.execution(
            f"Pallas Mosaic TPU kernel on {upstream.on_tpu()} (compiled by XLA for the chip)"))
    if purpose == "check":
        fn = make(params, interpret=upstream.checking_mode())
        execution = contract.execution(
            "Pallas TPU interpret mode (uninitialised memory = NaN)", interpret=True,
            poisoned=True, race_detection=True)
    else:
        fn = make(params, interpret=True)
        execution = contract.execution(
            "Pallas interpret mode (kernel discharged to XLA on the host)", interpret=True)
    return from_jax(fn, names, execution)


def races_found() -> bool:
    return upstream.races_found() or mgpu_interpret.races_found()


def reset() -> None:
    upstream.reset_interpreter()
    mgpu_interpret.reset_interpreter()


def baseline(name: str, params: dict[str, Any], build_dir: Path | None = None
             ) -> Runnable:
    return from_jax(baselines.make(name, params), INPUTS,
                    contract.execution(baselines.MODES[name]))


def reference_file() -> str:
    """The upstream source file actually imported (hashed into the build record)."""
    return upstream.splash.splash_attention_kernel.__file__


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown splash_attention variant {variant!r}; known: {VARIANTS}")


def work(params: dict[str, Any], computed: tuple[str, ...]) -> dict[str, Any]:
    """The least work of computing ``computed`` at ``params`` (``casebook.speed_of_light``):
    the attention's matmuls over the visible (query, key) pairs only — 2 for ``out``
    (Q·Kᵀ, P·V), 6 for the gradients (those 2, dP, dV, dK, dQ; P kept from the forward)
    — and each input read and each output written once."""
    heads_q, heads_kv, s, d = (params[k] for k in ("heads_q", "heads_kv", "seq_len",
                                                   "head_dim"))
    size = 4 if params["dtype"] == "float32" else 2
    pairs = heads_q * masks.visible_count(params)
    backward = set(computed) & set(GRADIENTS)
    matmuls = 6 if backward else 2
    q_side, kv_side = heads_q * s * d * size, heads_kv * s * d * size
    moved = (2 * q_side + 4 * kv_side + q_side if backward  # q, do, k, v; dq, dk, dv
             else 2 * q_side + 2 * kv_side)  # q, k, v; out
    return {"flops": 2 * matmuls * pairs * d, "bytes": moved, "math": "bf16",
            "basis": f"{matmuls} matmuls over {pairs:,} visible (query, key) pairs at head "
                     f"dim {d}; inputs read and outputs written once"}


def ablates(name: str) -> str:
    """The variant ablation ``name`` switches a part of off (``ablations``)."""
    return ablations.find(name).of


def ablation_refusal(name: str, params: dict[str, Any]) -> str | None:
    """Why ablation ``name`` changes nothing at ``params`` (None: it applies)."""
    return ablations.refusal(name, port.tuning(params))


def tile_candidates(variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """The port's tile rows the autotune rule measures for ``variant`` (``autotune``)."""
    from kernels.splash_attention import autotune

    return autotune.tile_candidates(variant, params)
