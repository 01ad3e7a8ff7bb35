"""Case 01's Blackwell (sm_100a) GEMMs: lowered on this host with their shared- and
tensor-memory budgets and the MMA they issue, refused where they cannot run, and fed the
128x4 scale atoms the tensor cores read. No interpreter runs them (tcgen05, tensor
memory), so nothing here executes the kernel: what it computes is for a Blackwell GPU."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernels.moe_nvfp4 as case
from casebook.core import config
from kernels import contract, mgpu_interpret, mgpu_lowering
from kernels.moe_nvfp4 import (
    checks,
    layouts,
    mgpu_fused_sm100,
    mgpu_gemm,
    mgpu_gemm_sm100,
    numerics,
    oracle_f64,
    port,
    problems,
)
from kernels.moe_nvfp4.mgpu_mainloop import SMEM_LIMIT_BYTES

pytestmark = pytest.mark.host_rehearsal

SPEC = config.load_case(config.load_global()["case_dir"], "moe_nvfp4")
BLACKWELL = [name for name, v in port.VARIANTS.items() if v.arch == "sm_100a"]
GEMMS = [name for name in BLACKWELL if port.VARIANTS[name].fused is None
         and not port.VARIANTS[name].quantize]
PATHS = [name for name in BLACKWELL if port.VARIANTS[name].quantize]
NVFP4_MMA = "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X"
POINTS = [p for key in ("points", "build_only_points") for p in SPEC.get(key, [])]


def test_the_case_ships_blackwell_variants():
    assert set(GEMMS) == {"gemm1_sm100a_n128k256s3", "gemm2_sm100a_n128k256s3"}
    assert set(PATHS) == {"moe_unfused_sm100a", "moe_fused_sm100a"}
    assert set(BLACKWELL) == {*GEMMS, *PATHS, "fused_sm100a_k256s3"}
    assert set(BLACKWELL) <= {v["name"] for v in SPEC["variants"]}


@pytest.mark.compile
@pytest.mark.parametrize("variant", GEMMS)
@pytest.mark.parametrize("point", POINTS, ids=[p["name"] for p in POINTS])
def test_every_point_lowers_for_sm100a_within_its_budgets(variant, point):
    (artifact,) = case.build(variant, point["params"])["artifacts"]
    facts, chosen = artifact["facts"], port.VARIANTS[variant]
    config_ = chosen.gemm1 or chosen.gemm2
    assert artifact["target"] == "cuda sm_100a"
    assert facts["tcgen05_mma"] == [NVFP4_MMA]  # native NVFP4: no decode, no bf16 MMA
    # The accumulator's 128 columns and both scale tiles, rounded up to a power of two.
    assert facts["tmem_columns"] == 256 and facts["tmem_limit_columns"] == 512
    # Our count of its buffers, plus the word where tcgen05.alloc writes the address.
    assert 0 < facts["dynamic_smem_bytes"] - mgpu_gemm_sm100.smem_bytes(config_) <= 16
    assert facts["dynamic_smem_bytes"] <= SMEM_LIMIT_BYTES
    e, m, hidden, inter = (point["params"][k] for k in ("experts", "m", "hidden", "inter"))
    n = 2 * inter if chosen.gemm1 else hidden
    assert sorted(facts["grid"]) == sorted([e, n // config_.block_n, m // 128])
    assert facts["block"] == [128, 1, 1]


@pytest.mark.compile
@pytest.mark.parametrize("point", POINTS, ids=[p["name"] for p in POINTS])
def test_the_whole_blackwell_path_lowers_at_every_point(point):
    """quantize (128x4 scales) -> GEMM1 -> SiLU·mul in XLA -> quantize -> GEMM2: each
    kernel built for sm_100a within its budgets, the GEMMs on the NVFP4 MMA with their
    accumulators in tensor memory, the quantize kernels using none."""
    params = point["params"]
    e, m, hidden, inter = (params[k] for k in ("experts", "m", "hidden", "inter"))
    built = {a["kind"].split(": ")[1].split(" ")[0]: a
             for a in case.build("moe_unfused_sm100a", params)["artifacts"]}
    assert list(built) == ["quantize", "requantize", "gemm1", "gemm2"]
    for stage, artifact in built.items():
        facts = artifact["facts"]
        assert artifact["target"] == "cuda sm_100a", stage
        assert 0 < facts["dynamic_smem_bytes"] <= SMEM_LIMIT_BYTES, stage
        if stage.startswith("gemm"):
            assert facts["tcgen05_mma"] == [NVFP4_MMA] and facts["tmem_columns"] == 256
        else:
            assert "tmem_columns" not in facts and "tcgen05_mma" not in facts
    assert sorted(built["gemm1"]["facts"]["grid"]) == sorted([e, 2 * inter // 128, m // 128])
    assert sorted(built["gemm2"]["facts"]["grid"]) == sorted([e, hidden // 128, m // 128])


@pytest.mark.compile
@pytest.mark.parametrize("point", POINTS, ids=[p["name"] for p in POINTS])
def test_the_fused_kernel_lowers_at_every_point_within_its_budgets(point):
    """GEMM1 + SiLU·mul + requantize on the NVFP4 MMA: its [128, 256] accumulator and
    both scale tiles fill tensor memory (rounded up: 512 columns of 512); shared memory
    is our count of its buffers and of the reduction scratch Pallas adds, and the word
    where tcgen05.alloc writes the address."""
    params = point["params"]
    e, m, inter = (params[k] for k in ("experts", "m", "inter"))
    for variant in ("fused_sm100a_k256s3", "moe_fused_sm100a"):
        built = {a["kind"].split(": ")[1].split(" ")[0]: a
                 for a in case.build(variant, params)["artifacts"]}
        facts = built["fused"]["facts"]
        assert built["fused"]["target"] == "cuda sm_100a"
        assert facts["tcgen05_mma"] == [NVFP4_MMA]
        assert facts["tmem_columns"] == 512 == facts["tmem_limit_columns"]
        extra = facts["dynamic_smem_bytes"] - mgpu_fused_sm100.smem_bytes(
            port.VARIANTS[variant].fused)
        assert 0 < extra <= 16 and facts["dynamic_smem_bytes"] <= SMEM_LIMIT_BYTES
        assert sorted(facts["grid"]) == sorted([e, inter // 256, m // 128])
        assert facts["block"] == [128, 1, 1]
    assert list(built) == ["quantize", "fused", "gemm2"]


@pytest.mark.compile
@pytest.mark.parametrize("variant, stages, outputs", [
    ("moe_unfused_sm100a", [False, True, False, True], ("a1", "h", "out_unfused")),
    ("moe_fused_sm100a", [False, True, True], ("a1", "a2", "out_fused"))])
def test_each_whole_blackwell_path_is_one_program_its_scales_wired_as_atoms(
        variant, stages, outputs):
    """The path as the case calls it, lowered whole: each quantize's 128x4 bytes (the
    fused kernel's included) reach the next MMA as its scale atoms (a wrong reshape fails
    that kernel's operand check)."""
    e, m, k, n = 2, 128, 256, 256
    chosen = port.VARIANTS[variant]
    lowered = mgpu_lowering.lower_for_cuda(port.function(chosen, e, m, k, n),
                                           port.input_shapes(e, m, k, n))
    assert [bool(launch.get("tcgen05_mma")) for launch in lowered["launches"]] == stages
    assert chosen.outputs() == outputs


def test_the_fused_kernel_refuses_what_it_cannot_tile_or_hold():
    with pytest.raises(ValueError, match=r"FusedConfig\(block_k=256, stages=4\): 243792 "
                                         r"bytes of shared memory exceed"):
        mgpu_fused_sm100.make(1, 128, 256, 1024, mgpu_fused_sm100.FusedConfig(256, 4))
    with pytest.raises(ValueError, match="block_k=128"):
        mgpu_fused_sm100.FusedConfig(128, 3)
    with pytest.raises(ValueError, match="stages=1"):
        mgpu_fused_sm100.FusedConfig(256, 1)
    with pytest.raises(ValueError, match=r"\(experts, m, n, k\)=\(1, 128, 128, 256\)"):
        mgpu_fused_sm100.make(1, 128, 128, 256, mgpu_fused_sm100.FusedConfig())
    with pytest.raises(ValueError, match="no interpreter runs an sm_100a kernel"):
        port.kernels(port.VARIANTS["fused_sm100a_k256s3"], 1, 128, 256, 256,
                     interpret=mgpu_interpret.interpret_params(race_detection=False))


def test_blackwell_w1_prepack_is_gate_up_order_of_the_reference_weight(rng):
    """The fused kernel's W1: the reference's rows in gate_up_order, codes unchanged, each
    row's scales moved with it into the 128x4 atoms: the dequantized weight, bit for bit."""
    e, n, k = 2, 256, 512
    packed, scales, _ = problems.quantized(rng, e, 2 * n, k)
    w, atoms = layouts.fused_w1_sm100(packed, scales)
    assert w.shape == packed.shape and atoms.shape == (e, 2 * n // 128, k // 64, 32, 16)
    got = numerics.dequantize(w, numerics.unswizzle(atoms.reshape(e, -1), 2 * n, k // 16))
    want = numerics.dequantize(packed, scales)[:, layouts.gate_up_order(n)]
    assert np.array_equal(got, want)


def test_a_blackwell_path_needs_the_scales_its_mma_reads():
    with pytest.raises(ValueError, match="must write the swizzled_128x4 scales"):
        port.Variant("row-major scales", quantize=port.mgpu_quantize.QuantizeConfig(64),
                     gemm1=mgpu_gemm_sm100.TuningConfig(),
                     gemm2=mgpu_gemm_sm100.TuningConfig())


@pytest.mark.compile
def test_wider_tiles_fill_tensor_memory_and_deeper_rings_are_refused():
    problem = mgpu_gemm.Problem(1, 128, 512, 512)
    wide = mgpu_gemm_sm100.TuningConfig(256, 256, 2)
    (launch,) = mgpu_lowering.lower_for_cuda(
        mgpu_gemm_sm100.make(problem, wide), mgpu_gemm_sm100.arg_shapes(problem))["launches"]
    assert launch["tmem_columns"] == 512
    deep = mgpu_gemm_sm100.TuningConfig(128, 256, 6)
    with pytest.raises(ValueError, match=r"TuningConfig\(block_n=128, block_k=256, stages=6\)"
                                         r": 254056 bytes of shared memory exceed"):
        mgpu_gemm_sm100.make(problem, deep)


@pytest.mark.compile
def test_a_kernel_over_the_tensor_memory_budget_fails_its_lowering():
    def body(x_ref, out_ref, acc):
        out_ref[...] = x_ref[...]

    def lower(columns: int):
        kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                              scratch_types={"acc": plgpu.TMEM((128, columns), jnp.float32)})
        return mgpu_lowering.lower_for_cuda(kernel, [jax.ShapeDtypeStruct((128, 128),
                                                                          jnp.float32)])

    assert lower(512)["launches"][0]["tmem_columns"] == 512
    with pytest.raises(ValueError, match="1024 columns, exceeding the limit of 512"):
        lower(1024)


@pytest.mark.parametrize("bad", [{"block_n": 64}, {"block_k": 128}, {"stages": 1}])
def test_a_configuration_the_kernel_cannot_tile_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        mgpu_gemm_sm100.TuningConfig(**{"block_n": 128, "block_k": 256, "stages": 3, **bad})


def test_a_problem_the_tiles_do_not_divide_is_refused():
    config_ = mgpu_gemm_sm100.TuningConfig()
    with pytest.raises(ValueError, match="k=384 must be a multiple of block_k=256"):
        mgpu_gemm_sm100.make(mgpu_gemm.Problem(1, 128, 128, 384), config_)
    with pytest.raises(ValueError, match=r"\(m, n\)=\(64, 128\)"):
        mgpu_gemm_sm100.make(mgpu_gemm.Problem(1, 64, 128, 256), config_)


def test_a_variant_never_mixes_targets():
    with pytest.raises(ValueError, match="sm_100a and sm_90a kernels mixed"):
        port.Variant("mixed", gemm1=mgpu_gemm_sm100.TuningConfig(),
                     gemm2=port.tiles(128, 128, 3))
    assert port.VARIANTS["gemm1_m128n128s3"].arch == "sm_90a"


def test_no_host_without_a_blackwell_gpu_runs_them(monkeypatch):
    params = POINTS[0]["params"]
    with pytest.raises(contract.NotRunnable, match="lowered only, never run"):
        case.kernel(BLACKWELL[0], params, "check")
    hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0",
                                   device_kind="NVIDIA H200")
    monkeypatch.setattr(jax, "devices", lambda: [hopper])
    with pytest.raises(contract.NotRunnable, match=r"Blackwell \(sm_100a\).*H200.*9\.0"):
        mgpu_interpret.placement("time", "sm_100a")
    blackwell = types.SimpleNamespace(platform="gpu", compute_capability="10.0",
                                      device_kind="NVIDIA B200")
    monkeypatch.setattr(jax, "devices", lambda: [blackwell])
    interpret, execution = mgpu_interpret.placement("time", "sm_100a")
    assert interpret is None and "B200 (sm_100a)" in execution["mode"]
    with pytest.raises(contract.NotRunnable, match=r"Hopper \(sm_90a\).*B200.*10\.0"):
        mgpu_interpret.placement("check", "sm_90a")
    with pytest.raises(ValueError, match="unknown architecture 'sm_120a'"):
        mgpu_interpret.placement("check", "sm_120a")


def test_the_scale_atoms_are_the_reference_128x4_layout(rng):
    """What tcgen05.cp copies to tensor memory: byte (r, 4q + c) of atom (i, j) is the
    scale of row 128i + 32q + r, K block 4j + c, zero past the edges (M not a multiple of
    128 here, K/16 not of 4)."""
    e, m, k_blocks = 2, 200, 6
    scales = rng.integers(1, 256, (e, m, k_blocks), dtype=np.uint8)
    atoms = numerics.scale_atoms(scales)
    assert atoms.shape == (e, 2, 2, 32, 16)
    i, j, r, q, c = np.meshgrid(*map(np.arange, (2, 2, 32, 4, 4)), indexing="ij")
    row, block = 128 * i + 32 * q + r, 4 * j + c
    inside = (row < m) & (block < k_blocks)
    for x in range(e):
        got = atoms[x][i, j, r, 4 * q + c]
        assert np.array_equal(got[inside], scales[x][row[inside], block[inside]])
        assert not got[~inside].any()
    # The same bytes as the reference's flat layout, at its own offset formula.
    flat = numerics.swizzle(scales)
    rows, cols = np.meshgrid(np.arange(m), np.arange(k_blocks), indexing="ij")
    offsets = numerics.swizzled_offset(rows, cols, k_blocks)
    assert np.array_equal(atoms.reshape(e, -1)[:, offsets], flat[:, offsets])


def test_the_case_inputs_give_the_blackwell_gemms_their_operands(rng):
    params = POINTS[0]["params"]
    given = case.make_inputs(params, rng)
    for name in ("a1_scales", "a2_scales", "w1_scales", "w2_scales"):
        assert np.array_equal(given[f"{name}_128x4"], numerics.scale_atoms(given[name]))
    e, m, k, n = (params[x] for x in ("experts", "m", "hidden", "inter"))
    shapes = dict(zip(port.INPUTS, port.input_shapes(e, m, k, n), strict=True))
    for name in port.INPUTS:
        assert given[name].shape == shapes[name].shape, name


def _epilogue_harness(e: int, m: int, n: int, interpreter):
    """The fused Blackwell kernel's epilogue (``quantize_pass`` and ``store_tile``, the
    kernel's own code) with its accumulator read from shared memory instead of tensor
    memory: acc [E, M, 2N] f32 in W1's prepacked column order -> (codes, 128x4 atoms)."""
    f = mgpu_fused_sm100
    mgpu_interpret.prepare_host_interpreter()

    def body(acc_ref, alpha_ref, gs_ref, masked_ref, q_ref, s_ref, acc_smem, barrier, **s):
        e_, block = lax.axis_index("experts"), lax.axis_index("act_blocks")
        m_block = lax.axis_index("m_blocks")
        m0, rows = m_block * f.BLOCK_M, masked_ref[e_]

        def read_quarters(c):
            return [plgpu.layout_cast(acc_smem[:, pl.ds(col, f.CHUNK)], f.LAYOUT)
                    for col in f.quarter_columns(c)]

        @pl.when(m0 < rows)
        def _():
            scale_bytes = []
            for p in range(f.ACT_BLOCK // f.PASS):
                plgpu.copy_gmem_to_smem(
                    acc_ref.at[e_, pl.ds(m0, f.BLOCK_M), pl.ds((2 * block + p) * 2 * f.PASS,
                                                               2 * f.PASS)], acc_smem, barrier)
                plgpu.barrier_wait(barrier)
                scale_bytes += f.quantize_pass(read_quarters, s["q_smem"], p, alpha_ref[e_],
                                               gs_ref[e_])
                plgpu.commit_smem()  # every thread has read acc_smem before it is refilled
            f.store_tile(scale_bytes, s, q_ref, s_ref, e_, m_block, block, rows)

    full = f.scratch_types(f.FusedConfig())
    scratch = {key: full[key] for key in ("q_smem", "s_smem", "atoms_smem")}
    return plgpu.kernel(
        body, out_type=(jax.ShapeDtypeStruct((e, m, n // 2), jnp.uint8),
                        jax.ShapeDtypeStruct((e, *mgpu_gemm_sm100.scale_atoms(m, n), 32, 16),
                                             jnp.uint8)),
        grid=(e, n // f.ACT_BLOCK, m // f.BLOCK_M),
        grid_names=("experts", "act_blocks", "m_blocks"),
        scratch_types={**scratch, "acc_smem": plgpu.SMEM((f.BLOCK_M, 2 * f.PASS), jnp.float32),
                       "barrier": plgpu.Barrier(num_arrivals=1)}, interpret=interpreter)


@pytest.mark.interpret
@pytest.mark.timeout(300)
def test_the_fused_epilogue_requantizes_the_accumulator_in_the_interpreter(rng, interpreter):
    """What the Blackwell fused kernel does after its MMAs, run by the interpreter (race
    detection on, memory NaN-poisoned) on a random accumulator: alpha, SiLU·mul and the
    NVFP4 quantize of every act column, the codes where gate_up_order put them and the
    scales as the 128x4 atoms GEMM2 reads, checked tie-aware against the float64 model
    (f32 evaluation bound: ``silu_mul_error``). Only the tensor-memory reads and the MMAs
    are not run here: no interpreter has them."""
    e, m, n = 3, 256, 512
    h = rng.standard_normal((e, m, 2 * n)).astype(np.float32) * rng.uniform(
        0.5, 4, (e, 1, 1)).astype(np.float32)
    alpha = rng.uniform(0.25, 2, e).astype(np.float32)
    masked = np.array([m, rng.integers(1, m), 0], np.int32)[rng.permutation(e)]
    exact = h.astype(np.float64) * alpha[:, None, None]
    act = np.nan_to_num(oracle_f64.silu_mul(exact))
    gs = problems.global_scale(act)
    acc = np.ascontiguousarray(h[..., layouts.gate_up_order(n)])
    packed, atoms = map(np.asarray, _epilogue_harness(e, m, n, interpreter)(
        acc, alpha, gs, masked))
    assert not mgpu_interpret.races_found(), "the interpreter's race detector reported a race"
    valid = oracle_f64.valid_rows(masked, m)
    act_error = oracle_f64.silu_mul_error(exact, np.abs(exact) * 2.0**-24)
    result = checks.tie_aware(act, gs, packed, atoms.reshape(e, -1), valid, act_error)
    assert result["passed"], result
    assert (packed[~valid] == 0xFF).all()  # rows past masked_m never written
    blocks_written = np.arange(m // 128)[None, :] * 128 < masked[:, None]
    assert (atoms[~blocks_written] == 0xFF).all() and (atoms[blocks_written] != 0xFF).any()


def _tensor_core_view(packed: np.ndarray, atoms: np.ndarray) -> np.ndarray:
    """An operand as the block-scaled MMA multiplies it, decoded from what the kernels
    hand over: jax's e2m1 bitcast of the packed bytes (``as_e2m1``), and each element's
    e4m3 scale read from the 128x4 atoms at the scale_vec::4X position of its row r and
    16-wide K block b: atom (r/128, b/4), byte (r%32, 4·((r%128)/32) + b%4)."""
    codes = np.asarray(mgpu_gemm_sm100.as_e2m1(jnp.asarray(packed)), np.float64)
    rows, k = codes.shape[1:]
    r, block = np.meshgrid(np.arange(rows), np.arange(k) // 16, indexing="ij")
    scale_bytes = atoms[:, r // 128, block // 4, r % 32, 4 * ((r % 128) // 32) + block % 4]
    return codes * np.asarray(mgpu_gemm_sm100.as_e4m3(jnp.asarray(scale_bytes)), np.float64)


def test_the_blackwell_operands_are_the_models_operands_bit_for_bit(rng):
    """Target-independent half of the block-scaled MMA: every Blackwell operand (A1, W1,
    the fused kernel's W1 prepack, A2, W2), decoded as the tensor core reads it, equals
    the model's dequantized operand bit for bit, so each product the MMA forms is the
    oracle's (the products are exact; only the hardware's f32 summation is unchecked)."""
    params = POINTS[0]["params"]
    given = case.make_inputs(params, rng)
    deq = numerics.dequantize
    order = layouts.gate_up_order(params["inter"])
    for got, want in (
            (("a1_packed", "a1_scales_128x4"), deq(given["a1_packed"], given["a1_scales"])),
            (("w1_packed", "w1_scales_128x4"), deq(given["w1_packed"], given["w1_scales"])),
            (("w1_f_sm100", "w1_f_sm100_scales_128x4"),
             deq(given["w1_packed"], given["w1_scales"])[:, order]),
            (("a2_packed", "a2_scales_128x4"), deq(given["a2_packed"], given["a2_scales"])),
            (("w2_packed", "w2_scales_128x4"), deq(given["w2_packed"], given["w2_scales"]))):
        view = _tensor_core_view(given[got[0]], given[got[1]])
        assert view.shape == want.shape and np.array_equal(view, want), got
        assert np.count_nonzero(want) > 0, got  # not vacuous
