"""Subnormal inputs (issue 14, item 6): XLA on the host CPU flushes them to zero, so the
interpreted quantize kernel sees ±0 where the model sees a subnormal. This changes codes
or scales only where an expert's global scale exceeds 2^115, and verification's inputs
have no subnormals. Stated on the case 01 page (``numerics_notes``) and the methods page."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import yaml
from jax import lax

import kernels.moe_nvfp4 as case
from kernels import mgpu_interpret
from kernels.moe_nvfp4 import checks, mgpu_quantize, numerics, problems

pytestmark = [pytest.mark.interpret, pytest.mark.compile, pytest.mark.host_rehearsal]

E, M, K = 2, 256, 512  # the interpreted shape of tests/moe_nvfp4/test_moe_nvfp4_quantize.py
TINY = 2.0**-126  # the smallest normal float32 (and bf16)
# |x| < 2^-126 scaled by gs/sf (sf >= 2^-9 when not 0) reaches e2m1's first step 0.25 only
# if gs > 2^115; a block of only subnormals needs gs > 6·2^116 for a scale above 0.
GS_BOUND = 2.0**115
NORMAL, SUBNORMAL, MIXED = range(3)  # the kinds of 16-element block drawn


def subnormal(x: np.ndarray) -> np.ndarray:
    return (x != 0) & (np.abs(x) < TINY)


def flushed(x: np.ndarray) -> np.ndarray:
    """x with every subnormal replaced by a zero of its sign."""
    return np.where(subnormal(x), np.copysign(0.0, x), x).astype(np.float32)


def between(rng, shape, low: float, high: float) -> np.ndarray:
    """Random bf16 values (as float32) with |x| in [low, high) and a random sign: bit
    patterns drawn uniformly (they order like the magnitudes)."""
    lo, hi = (int(np.float32(v).view(np.uint32) >> 16) for v in (low, high))
    bits = rng.integers(lo, hi, shape) | rng.integers(0, 2, shape) << 15
    return bits.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


def draw(rng, amax: float, normal_top: float, mixed: tuple[float, float]):
    """(x [E, M, K], kind of each block [E, M, K/16]): each block all normal (|x| below
    ``normal_top``), all subnormal, or mixed (normals in ``mixed`` beside subnormals, at
    least one of each). Block 0 of row 0 holds each expert's amax, so gs = 2688 / amax."""
    shape = (E, M, K // 16, 16)
    kinds = rng.integers(0, 3, shape[:-1])
    kinds[:, 0, 0] = NORMAL
    n_normal = rng.integers(1, 16, shape[:-1])[..., None]
    mixed_normal = rng.random(shape).argsort(-1).argsort(-1) < n_normal
    tiny = between(rng, shape, 2.0**-133, TINY)
    x = np.where(kinds[..., None] == NORMAL, between(rng, shape, TINY, normal_top),
                 np.where((kinds[..., None] == MIXED) & mixed_normal,
                          between(rng, shape, *mixed), tiny))
    x[:, 0, 0, 0] = amax
    return x.reshape(E, M, K), kinds


def interpreted_quantize(interpreter, x, gs):
    """The ``quantize`` variant's kernel in the interpreter, every row valid: (packed,
    row-major scales)."""
    fn = mgpu_quantize.make(E, M, K, mgpu_quantize.QuantizeConfig(64), interpreter)
    out = fn(jnp.asarray(x, jnp.bfloat16), gs, np.full(E, M, np.int32))
    assert not mgpu_interpret.races_found()
    return tuple(map(np.asarray, out))


EVERY_ROW = np.ones((E, M), bool)


def test_xla_on_the_host_cpu_flushes_float32_subnormals(rng):
    """The mechanism: XLA's CPU client computes with denormals-are-zero (subnormal operands
    read as ±0) and flush-to-zero (subnormal results written as ±0), as TensorFlow does;
    a bit cast keeps the bits, so the kernel still sees the sign."""
    magnitude = rng.integers(1, 2**23, 64, dtype=np.uint32)
    bits = magnitude | rng.integers(0, 2, 64, dtype=np.uint32) << 31
    x = bits.view(np.float32)  # random float32 subnormals
    normal = np.float32(2.0**-100)
    cpu = jax.devices("cpu")[0]

    @jax.jit
    def ops(v, n):
        return (v * np.float32(2.0**20), v == 0, n * np.float32(2.0**-30),
                lax.bitcast_convert_type(v, jnp.uint32))

    scaled, is_zero, underflow, kept = map(np.asarray, ops(jax.device_put(x, cpu),
                                                           jax.device_put(normal, cpu)))
    assert (x * np.float32(2.0**20) != 0).all() and normal * np.float32(2.0**-30) != 0
    assert (scaled == 0).all() and (np.signbit(scaled) == np.signbit(x)).all()
    assert is_zero.all()
    assert underflow == 0
    assert (kept == bits).all()


@pytest.mark.timeout(300)
def test_the_interpreted_quantize_flushes_subnormal_inputs_where_the_model_does_not(
        rng, interpreter):
    """gs = 2688·2^116 (amax 2^-116), above the bound: the interpreter's output is the
    model's quantization of x with subnormals flushed. Blocks of only subnormals get scale
    0 and codes 0 where the model gives every one a real scale; subnormals beside normals
    get ±0 codes (the block's scale unchanged) where the model gives some a non-zero code.
    Fails when the interpreter stops flushing: then the statement must be revisited."""
    x, kinds = draw(rng, 2.0**-116, 2.0**-117, (TINY, 2.0**-124))
    gs = problems.global_scale(x)
    assert (gs == np.float32(2688 * 2.0**116)).all() and (gs > GS_BOUND).all()
    packed, scales = interpreted_quantize(interpreter, x, gs)
    result = checks.tie_aware(flushed(x), gs, packed, scales, EVERY_ROW)
    assert result["passed"], result

    want_packed, want_scales = numerics.quantize(x, gs)  # the model on x as given
    codes = numerics.unpack(packed).reshape(E, M, K // 16, 16)
    want_codes = numerics.unpack(want_packed).reshape(codes.shape)
    only = kinds == SUBNORMAL
    assert (scales[only] == 0).all() and (codes[only] == 0).all()
    assert (want_scales[only] > 0).all() and (want_codes[only] != 0).any()
    beside = (kinds == MIXED)[..., None] & subnormal(x).reshape(codes.shape)
    assert (codes[beside] == np.where(np.signbit(x.reshape(codes.shape)[beside]), 8, 0)).all()
    assert (want_codes[beside] & 7).any()


@pytest.mark.timeout(300)
def test_flushing_changes_no_code_and_no_scale_at_the_global_scale_bound(rng, interpreter):
    """gs = 2^115 (amax 21·2^-108): the interpreter matches the model on x as given, with
    the worst case drawn: mixed blocks whose scale is e4m3's smallest, 2^-9, where the
    largest subnormals reach x·gs/sf = 127·2^-9 < 0.25, just short of a non-zero code."""
    x, kinds = draw(rng, 21 * 2.0**-108, 2.0**-109, (1.5 * 2.0**-122, 1.75 * 2.0**-122))
    gs = problems.global_scale(x)
    assert (gs == np.float32(GS_BOUND)).all()
    packed, scales = interpreted_quantize(interpreter, x, gs)
    result = checks.tie_aware(x, gs, packed, scales, EVERY_ROW)
    assert result["passed"], result

    sf = numerics.e4m3_value(numerics.quantize(x, gs)[1])
    mixed = np.repeat(kinds == MIXED, 16, axis=-1)
    assert (numerics.round_e4m3(numerics.block_scale(x, gs))[kinds == MIXED] == 2.0**-9).all()
    worst = np.abs(numerics.scaled_value(x, gs, sf))[mixed & subnormal(x)].max()
    assert 0.2 < worst < 0.25, worst


# Read as plain YAML: the workflow's config loader is not on the kernel-only stack.
POINTS = yaml.safe_load((Path(__file__).parents[2] / "configs/cases/moe_nvfp4.yaml"
                         ).read_text())["points"]


@pytest.mark.parametrize("point", POINTS, ids=[p["name"] for p in POINTS])
def test_verification_inputs_hold_no_subnormals(rng, point):
    """make_inputs draws N(0,1)·2^[-3,3] rounded to bf16 (a value below 2^-126 has
    probability about 1e-37 per element), and its global scales stay far below 2^115, so
    even a subnormal would not move a code."""
    given = case.make_inputs(point["params"], rng)
    hidden = np.asarray(given["hidden_bf16"], np.float32)
    assert np.isfinite(hidden).all() and not subnormal(hidden).any()
    assert (given["a1_gs"] < GS_BOUND).all()


def test_flashinfer_builds_its_nvfp4_quantize_with_fast_math():
    """The reference's grouped quantize (``scaled_fp4_grouped_quantize``) runs from the
    module ``gen_fp4_quantization_module`` specifies: built by ``gen_jit_spec`` with its
    default ``use_fast_math=True`` (nvcc -use_fast_math implies -ftz=true), so it likely
    flushes subnormals too. Read from the installed source; FlashInfer is not imported."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("FlashInfer is not installed here (env/reference.lock)")
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / "jit/core.py").exists():
        pytest.skip("FlashInfer's JIT sources are not here (the offline GPU host's bundle "
                    "carries only the kernel file case 01 hashes)")

    def function(path, name):
        tree = ast.parse((root / path).read_text())
        return next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                    and f.name == name)

    args = function("jit/core.py", "gen_jit_spec").args
    with_defaults = [*zip(args.args[len(args.args) - len(args.defaults):], args.defaults,
                          strict=True), *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    assert [ast.literal_eval(d) for a, d in with_defaults if a.arg == "use_fast_math"] == [True]
    quantize = function("quantization/fp4_quantization.py", "gen_fp4_quantization_module")
    (call,) = [c for c in ast.walk(quantize) if isinstance(c, ast.Call)
               and getattr(c.func, "id", None) == "gen_jit_spec"]
    assert not {k.arg for k in call.keywords} & {"use_fast_math",
                                                  "extra_cuda_cflags_by_source"}
    for path in ("jit/core.py", "quantization/fp4_quantization.py"):
        assert "ftz" not in (root / path).read_text()  # no flag undoes -use_fast_math's
    grouped = function("quantization/fp4_quantization.py", "scaled_fp4_grouped_quantize")
    assert any(getattr(c.func, "id", None) == "get_fp4_quantization_module"
               for c in ast.walk(grouped) if isinstance(c, ast.Call))
