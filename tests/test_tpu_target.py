"""The tpu-v5e target on a host without one: where each case's variants run on a TPU
(jax's device faked), and the TPU host's bundle (what is carried there, and why not)."""

from __future__ import annotations

import os
import types

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
    # its near misses are dense: no check power at a sampled-row point
    assert paths.check_power_record("tpu-v5e", "splash_attention", "s4k_d128_causal") \
        not in tpu_records
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
