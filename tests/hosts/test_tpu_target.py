"""The tpu-v5e target on a host without one: where each case's variants run on a TPU
(jax's device faked), and the TPU host's bundle (what is carried there, and why not)."""

from __future__ import annotations

import os
import tempfile
import types
from pathlib import Path

import jax
import pytest
import yaml

from casebook.core import config, locks, paths
from casebook.core.errors import CasebookError
from casebook.hosts import wheelhouse
from casebook.run import off_device
from casebook.stages import point_job
from kernels import contract, mgpu_interpret
from kernels.grouped_gemm_fp8_bf16 import device as grouped_device

TPU = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
SPLASH_POINT = {"heads_q": 2, "heads_kv": 2, "seq_len": 256, "head_dim": 64,
                "dtype": "bfloat16", "mask": {"kind": "causal"}}


@pytest.fixture
def on_a_tpu(monkeypatch):
    monkeypatch.setattr(jax, "devices", lambda *args: [TPU])


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_mosaic_gpu_kernel_is_not_runnable_on_a_tpu_and_says_why(on_a_tpu, arch):
    with pytest.raises(contract.NotRunnable,
                       match=rf"^not runnable on a TPU: a Mosaic GPU \({arch}\) kernel needs an "
                             r"NVIDIA GPU .*TPU v5 lite$"):
        mgpu_interpret.placement("time", arch)


def test_upstream_splash_runs_compiled_for_the_chip_not_interpreted(on_a_tpu):
    from kernels import splash_attention

    for variant in ("upstream", "upstream_bwd"):
        runnable = splash_attention.kernel(variant, SPLASH_POINT, "check")
        assert runnable.execution["mode"] == ("Pallas Mosaic TPU kernel on TPU v5 lite "
                                              "(compiled by XLA for the chip)")
        assert not runnable.execution["interpret"]


def test_case_03s_ragged_dot_baseline_runs_on_a_tpu_and_its_gpu_kernels_do_not(on_a_tpu,
                                                                                 monkeypatch):
    from kernels import grouped_gemm_fp8_bf16 as grouped

    monkeypatch.setattr(grouped_device, "sm90_device", lambda: None)
    params = {"m": [16, 40, 0, 128, 64], "n": 512, "k": 1024, "chunk": 128,
              "mode": "scale_only", "alpha": 0.5, "beta": 0.5, "dtype": "e5m2_bf16"}
    runnable = grouped.baseline("xla_ragged_dot_bf16", params)
    assert runnable.execution["mode"] == "XLA ragged_dot on pre-converted bf16 B"
    with pytest.raises(contract.NotRunnable, match="sm_90 GPU"):
        grouped.kernel("cute_dsl", params, "time")


def test_the_tpu_bundle_carries_the_pipeline_and_keeps_the_hosts_jax():
    host = wheelhouse.HOSTS["tpu"]
    decisions = wheelhouse.plan(locks.read_lock(paths.lock_file(host.lock)),
                                wheelhouse.read_host(host.package_list), host.not_carried)
    carried = {n for n, d in decisions.items() if d["decision"] == "carry"}
    assert {"snakemake", "jsonschema", "pyyaml", "psutil", "nvidia-ml-py"} <= carried
    kept = {"jax", "jaxlib", "numpy", "scipy", "ml-dtypes"}
    assert all(decisions[n]["decision"].startswith("on the host") for n in kept)
    dropped = {"matplotlib", "pandas", "nvidia-cuda-nvcc", "cuda-python", "pytest", "ruff"}
    assert all(decisions[n]["decision"].startswith("not needed there") for n in dropped)
    assert host.platform["abi"] == "cp311" and wheelhouse.HOSTS["gpu"].platform["abi"] == "cp312"


def test_a_tpu_targets_job_without_the_device_keeps_off_the_chip(monkeypatch):
    """One process at a time can open a TPU: a lowering or a figure of a tpu-v5e run gets
    the CPU (JAX_PLATFORMS), the job that holds the device keeps it, other targets are
    left as they are."""
    from casebook.stages import hostcapture

    assert set(off_device.TPU_TARGETS) == set(hostcapture.TPU_CLASSES.values())

    def job(target, **resources):
        return types.SimpleNamespace(wildcards=types.SimpleNamespace(target=target),
                                     resources=types.SimpleNamespace(**resources))

    # Recorded first, so that teardown restores both whatever the code set.
    monkeypatch.setenv(contract.TARGET_PLATFORM, "")
    monkeypatch.delenv(contract.TARGET_PLATFORM)
    for kept in (job("h200", gpu=0), job("cpu"), types.SimpleNamespace()):
        monkeypatch.delenv("JAX_PLATFORMS", raising=False)
        assert not off_device.off_the_chip(kept)
        assert "JAX_PLATFORMS" not in os.environ
        assert contract.TARGET_PLATFORM not in os.environ
    assert not off_device.off_the_chip(job("tpu-v5e", gpu=1))
    assert "JAX_PLATFORMS" not in os.environ and os.environ[contract.TARGET_PLATFORM] == "tpu"
    assert off_device.off_the_chip(job("tpu-v5e", gpu=0))
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.delenv(contract.TARGET_PLATFORM)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_tpu_targets_job_refuses_a_mosaic_gpu_kernel_without_opening_the_chip(
        monkeypatch, arch):
    """Opening the chip costs seconds a process, and 14 of a splash point's 32 jobs are
    Mosaic GPU variants: where the pipeline says the target is a TPU, placement refuses
    before jax is asked for a device."""
    monkeypatch.setenv(contract.TARGET_PLATFORM, "tpu")
    monkeypatch.setattr(jax, "devices", lambda *args: pytest.fail("the chip was opened"))
    with pytest.raises(contract.NotRunnable,
                       match=rf"^not runnable on a TPU: a Mosaic GPU \({arch}\) kernel needs an "
                             r"NVIDIA GPU .*target is a TPU"):
        mgpu_interpret.placement("check", arch)


# -- points measured on the TPU alone (build-only elsewhere) ------------------------------

SHIPPED = paths.SOURCE_ROOT / config.SHIPPED_CASES


def shipped_splash() -> dict:
    return config.load_case(SHIPPED, "splash_attention")


def test_a_build_only_point_measured_on_the_tpu_is_a_point_there_alone():
    spec = shipped_splash()
    on_tpu = [p["name"] for p in paths.for_target(spec, "tpu-v5e")["points"]]
    assert {"s4k_d128_causal", "s4k_d128_local"} <= set(on_tpu)
    assert paths.for_target(spec, "cpu") is spec
    assert "s4k_d128_causal" not in [p["name"] for p in
                                     paths.for_target(spec, "tpu-v5e")["build_only_points"]]
    tpu_records = paths.case_records(spec, "tpu-v5e")
    for record in (paths.verify_record("tpu-v5e", "splash_attention", "upstream",
                                       "s4k_d128_causal"),
                   paths.time_record("tpu-v5e", "splash_attention", "upstream_bwd",
                                     "s4k_d128_causal"),
                   paths.compare_record("tpu-v5e", "splash_attention", "s4k_d128_local")):
        assert record in tpu_records
    # its check power too (near misses from the float32 reference on the chip)
    assert paths.check_power_record("tpu-v5e", "splash_attention", "s4k_d128_causal") \
        in tpu_records
    assert not [r for r in paths.case_records(spec, "cpu") if "s4k_d128" in r]


def test_a_job_of_a_point_measured_elsewhere_is_refused_naming_the_point():
    job = point_job.load(str(SHIPPED), "splash_attention", "tpu-v5e",
                     "s4k_d128_causal", "upstream")
    assert job.params["seq_len"] == 4096 and not job.build_only
    with pytest.raises(CasebookError, match="s4k_d128_causal"):
        point_job.load(str(SHIPPED), "splash_attention", "cpu", "s4k_d128_causal",
                   "upstream")


def on_cpu(spec: dict) -> None:
    spec["build_only_points"][0]["measured_on"] = ["cpu"]


def at_a_dtype_without_tolerance(spec: dict) -> None:
    """float32: a dtype no interpreted point has, its tolerance removed."""
    del spec["tolerances"]["float32"]
    spec["build_only_points"][0]["params"]["dtype"] = "float32"
    spec["build_only_points"][0]["measured_on"] = ["tpu-v5e"]


@pytest.mark.parametrize("change, key", [
    (on_cpu, "build_only_points.0.measured_on.0"),
    (at_a_dtype_without_tolerance, "build_only_points.0.params.dtype"),
], ids=["on-cpu", "no-tolerance"])
def test_a_bad_measured_on_is_refused_naming_its_key(tmp_path, change, key):
    spec = yaml.safe_load((SHIPPED / "splash_attention.yaml").read_text())
    change(spec)
    (tmp_path / "splash_attention.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(CasebookError, match=rf"splash_attention\.yaml: {key}"):
        config.load_case(tmp_path, "splash_attention")


@pytest.mark.parametrize("error, fits", [
    (RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 64.0G "
                  "of 15.75G hbm."), False),
    (MemoryError(), False),
    (RuntimeError("INVALID_ARGUMENT: a bug, not a size"), True),
])
def test_a_baseline_that_does_not_fit_in_memory_is_recorded_so_and_any_other_error_fails(
        tmp_path, monkeypatch, error, fits):
    """At S 32768 XLA's dense attention needs 64 GiB of logits: the record says it does
    not fit, with XLA's own line, and the run goes on; any other failure still fails."""
    import kernels.splash_attention as splash
    from casebook.core import records
    from casebook.stages import timing

    def failing(name, params, build_dir=None):
        def call(*args):
            raise error
        return contract.Runnable(prepare=lambda inputs: tuple(inputs[n] for n in splash.INPUTS),
                                 call=call, sync=lambda out: None, fetch=lambda out: out,
                                 execution=contract.execution("XLA on the chip"))

    monkeypatch.setattr(splash, "baseline", failing)
    out = tmp_path / "baseline.json"
    run = lambda: timing.time_baseline(  # noqa: E731
        "configs/cases", "splash_attention", "xla_dot_product_attention", "mha_causal_f16",
        "cpu", {}, str(tmp_path / "no-floor.json"), str(out), str(tmp_path / "s.csv"))
    if fits:
        with pytest.raises(RuntimeError, match="a bug"):
            run()
        assert not out.exists()
        return
    run()
    record = records.read(out, "baseline")
    assert record["timed"] is False
    assert record["not_timed_reason"].startswith("does not fit in the device's memory")
    assert isinstance(error, MemoryError) or "Used 64.0G" in record["not_timed_reason"]


def test_a_tpu_hosts_figures_name_its_chip_not_a_missing_gpu():
    """The committed TPU window's host and env records: the hardware condition names the
    chip, its memory and runtime (it read "GPU: none" on the first TPU figures)."""
    from casebook.core import records
    from casebook.report import conditions

    host = records.read(paths.host_record("tpu-v5e"), "host")
    env = records.read(paths.env_record("tpu-v5e"), "env")
    spec = config.load_case(config.load_global()["case_dir"], "splash_attention")
    lines = conditions.hardware_software(types.SimpleNamespace(host=host, env=env, spec=spec))
    chip = [line for line in lines if line.startswith("TPU: ")]
    assert chip and "TPU v5 lite" in chip[0] and "HBM" in chip[0]
    assert not any(line.startswith("GPU: none") for line in lines)
    no_chip = {**host, "tpus": []}
    lines = conditions.hardware_software(types.SimpleNamespace(host=no_chip, env=env, spec=spec))
    assert any(line.startswith("GPU: none") for line in lines)


# -- cases 01 and 03 on the TPU: their XLA baselines run there, their GPU kernels do not --

GROUPED_POINT = {"m": [16, 40, 0, 128, 64], "n": 512, "k": 1024, "chunk": 128,
                 "mode": "scale_only", "alpha": 0.5, "beta": 0.5, "dtype": "e5m2_bf16"}
MOE_POINT = {"experts": 2, "m": 128, "hidden": 256, "inter": 256, "dtype": "nvfp4"}


@pytest.fixture
def tpu_target(monkeypatch):
    """A job whose target is a TPU (off_device.off_the_chip's mark); the chip never opened."""
    monkeypatch.setenv(contract.TARGET_PLATFORM, "tpu")
    monkeypatch.setattr(jax, "devices", lambda *args: pytest.fail("the chip was opened"))


@pytest.mark.parametrize("kind, name, why", [
    ("kernel", "cute_dsl", "CuTe DSL port is an sm_90a kernel"),
    ("kernel", "cutlass_ex69", "compiled by nvcc for sm_90a"),
    ("baseline", "cutlass_ex69", "compiled by nvcc for sm_90a"),
])
def test_case_03s_gpu_kernels_are_not_runnable_on_a_tpu_and_say_why(tpu_target, kind, name,
                                                                      why):
    from kernels import grouped_gemm_fp8_bf16 as grouped

    call = (lambda: grouped.kernel(name, GROUPED_POINT, "time", build_dir="b")) \
        if kind == "kernel" else (lambda: grouped.baseline(name, GROUPED_POINT, "b"))
    with pytest.raises(contract.NotRunnable, match=rf"^not runnable on a TPU: .*{why}"):
        call()


def test_case_03s_port_is_recorded_not_built_on_a_tpu_host_without_cute_dsl(tpu_target,
                                                                             monkeypatch):
    from kernels import grouped_gemm_fp8_bf16 as grouped
    from kernels.grouped_gemm_fp8_bf16 import compile_port

    monkeypatch.setattr(compile_port, "dsl_installed", lambda: False)
    built = grouped.build("cute_dsl", GROUPED_POINT, build_dir="b")
    assert built["artifacts"] == [] and "not installed on a TPU host" in built["not_built"]
    monkeypatch.delenv(contract.TARGET_PLATFORM)  # elsewhere the missing export still fails
    with pytest.raises(RuntimeError, match="CuTe DSL is not installed here"):
        grouped.build("cute_dsl", GROUPED_POINT, build_dir=str(Path(tempfile.mkdtemp())))


@pytest.mark.parametrize("name", ["xla_ragged_dot_bf16", "xla_dense_per_group_bf16"])
def test_case_03s_xla_baselines_agree_with_the_oracle_and_a_wrong_one_fails(name):
    """Run here on jax's CPU (as on the chip): within the case's bound, an empty group
    included; one element off by 1% of its value, or group order swapped, fails."""
    import numpy as np

    from kernels import grouped_gemm_fp8_bf16 as grouped
    from kernels.grouped_gemm_fp8_bf16 import baselines, problems

    problem = problems.from_params(GROUPED_POINT)
    tolerance = config.load_case(SHIPPED, "grouped_gemm_fp8_bf16")["tolerances"]["e5m2_bf16"]
    inputs = grouped.make_inputs(GROUPED_POINT, np.random.default_rng(7))
    runnable = baselines.XLA[name](problem)
    got = np.asarray(runnable.fetch(runnable.call(*runnable.prepare(dict(inputs)))))
    want = grouped.oracle(GROUPED_POINT, inputs)
    assert grouped.compare(GROUPED_POINT, inputs, "out", got, want, tolerance)["passed"]
    off = got.copy()
    off[3, 5] = np.float16(float(off[3, 5]) * 1.01 + 0.01)
    assert not grouped.compare(GROUPED_POINT, inputs, "out", off, want, tolerance)["passed"]
    swapped = np.concatenate([got[16:], got[:16]])
    assert not grouped.compare(GROUPED_POINT, inputs, "out", swapped, want, tolerance)["passed"]


@pytest.mark.parametrize("name", ["xla_ragged_dot_bf16", "xla_dense_per_group_bf16"])
def test_case_03s_xla_baselines_run_on_a_tpu(on_a_tpu, monkeypatch, name):
    from kernels import grouped_gemm_fp8_bf16 as grouped

    monkeypatch.setattr(grouped_device, "sm90_device", lambda: pytest.fail("a GPU was asked"))
    assert grouped.baseline(name, GROUPED_POINT).execution["mode"].startswith("XLA ")


def test_case_01s_port_and_reference_are_not_runnable_on_a_tpu_its_baselines_are(
        tpu_target, monkeypatch):
    from kernels import moe_nvfp4

    for variant in ("moe_fused", "gemm1_sm100a_n128k256s3", "reference_flashinfer"):
        with pytest.raises(contract.NotRunnable, match=r"^not runnable on a TPU: \S"):
            moe_nvfp4.kernel(variant, MOE_POINT, "check")
    monkeypatch.setattr(jax, "devices", lambda *args: [TPU])  # a baseline's job holds the chip
    for name in ("dense_bf16", "ragged_dot"):
        assert moe_nvfp4.baseline(name, MOE_POINT).execution["device"] == "tpu"


def test_cases_01_and_03_points_on_the_tpu_and_only_there():
    """Case 03's small example configurations are points of tpu-v5e (verify, time, both XLA
    baselines, compare), lowered only on the CPU; case 01 measures its case points there and
    the upstream benchmark's five shapes, which the CPU target only lowers."""
    grouped = config.load_case(SHIPPED, "grouped_gemm_fp8_bf16")
    on_tpu = [p["name"] for p in paths.for_target(grouped, "tpu-v5e")["points"]]
    assert on_tpu == ["ex69_defaults", "epilogue_multichunk", "convert_beta", "test_random",
                      "test_epilogue", "test_small", "test_small_large_group"]
    records = paths.case_records(grouped, "tpu-v5e")
    for baseline in ("xla_ragged_dot_bf16", "xla_dense_per_group_bf16", "cutlass_ex69"):
        assert paths.baseline_record("tpu-v5e", "grouped_gemm_fp8_bf16", baseline,
                                     "test_small_large_group") in records
    assert paths.time_record("tpu-v5e", "grouped_gemm_fp8_bf16", "cute_dsl",
                             "test_random") in records
    assert not [r for r in paths.case_records(grouped, "cpu") if "/test_" in r]
    assert "test_fixed" not in on_tpu  # K 8192: the host's float64 check is too slow
    moe = config.load_case(SHIPPED, "moe_nvfp4")
    upstream_shapes = ["g6_m1024", "g6_m512", "g1_m1024", "g2_m512", "g4_m256"]
    assert [p["name"] for p in paths.for_target(moe, "tpu-v5e")["points"]] == [
        "e2_m128_h256_i256", "e3_m128_h512_i256", *upstream_shapes]
    on_cpu = paths.for_target(moe, "cpu")
    assert [p["name"] for p in on_cpu["points"]] == ["e2_m128_h256_i256", "e3_m128_h512_i256"]
    assert set(upstream_shapes) <= {p["name"] for p in on_cpu["build_only_points"]}
    assert paths.baseline_record("tpu-v5e", "moe_nvfp4", "ragged_dot", "g6_m1024") in (
        paths.case_records(moe, "tpu-v5e"))


def test_the_tpu_dag_holds_cases_01_and_03s_new_jobs():
    """`snakemake -n` for tpu-v5e: the comparisons the window's new steps ask for, with
    the new baseline's job and the port's, resolve to jobs (all of them forced: the
    committed results/tpu-v5e/ may already hold them)."""
    import subprocess
    import sys

    wanted = [paths.compare_record("tpu-v5e", "grouped_gemm_fp8_bf16", "test_small_large_group"),
              paths.compare_record("tpu-v5e", "moe_nvfp4", "e3_m128_h512_i256")]
    done = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--forceall", "--nolock",
                           "--cores", "1", "--config", "target=tpu-v5e", "--", *wanted],
                          cwd=paths.SOURCE_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for job in (*wanted,
                paths.baseline_record("tpu-v5e", "grouped_gemm_fp8_bf16",
                                      "xla_dense_per_group_bf16", "test_small_large_group"),
                paths.verify_record("tpu-v5e", "grouped_gemm_fp8_bf16", "cute_dsl",
                                    "test_small_large_group"),
                paths.baseline_record("tpu-v5e", "moe_nvfp4", "dense_bf16",
                                      "e3_m128_h512_i256"),
                paths.verify_record("tpu-v5e", "moe_nvfp4", "reference_flashinfer",
                                    "e3_m128_h512_i256")):
        assert job in done.stdout, job
