"""The tpu-v5e target on a host without one: where each case's variants run on a TPU
(jax's device faked), and the TPU host's bundle (what is carried there, and why not)."""

from __future__ import annotations

import os
import types

import jax
import pytest

from casebook import off_device, paths, wheelhouse
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
    decisions = wheelhouse.plan(wheelhouse.read_lock(paths.lock_file(host.lock)),
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
    from casebook import hostcapture

    assert set(off_device.TPU_TARGETS) == set(hostcapture.TPU_CLASSES.values())

    def job(target, **resources):
        return types.SimpleNamespace(wildcards=types.SimpleNamespace(target=target),
                                     resources=types.SimpleNamespace(**resources))

    for kept in (job("tpu-v5e", gpu=1), job("h200", gpu=0), job("cpu"),
                 types.SimpleNamespace()):
        monkeypatch.delenv("JAX_PLATFORMS", raising=False)
        assert not off_device.off_the_chip(kept)
        assert "JAX_PLATFORMS" not in os.environ
    assert off_device.off_the_chip(job("tpu-v5e", gpu=0))
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    monkeypatch.delenv("JAX_PLATFORMS")
