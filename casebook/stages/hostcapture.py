"""Condition 2 (hardware): the host, its GPUs and TPUs as found. No accelerator is a fact,
not a crash."""

from __future__ import annotations

import contextlib
import os
import platform
import re
from pathlib import Path
from typing import Any

import psutil

from casebook.core.errors import CasebookError

# GPU product names -> the device classes results are keyed by.
GPU_CLASSES = {"H100": "h100", "H200": "h200", "B200": "b200"}
# TPU device kinds (JAX's ``device_kind``) -> device classes: a v5e chip calls itself
# "TPU v5 lite".
TPU_CLASSES = {"TPU v5 lite": "tpu-v5e", "TPU v5e": "tpu-v5e"}
TARGETS = ("cpu", *GPU_CLASSES.values(), *dict.fromkeys(TPU_CLASSES.values()))
# The device classes that run a kernel built for each architecture (compute capability
# 9.0 and 10.0: an sm_90a kernel does not run on a B200, nor an sm_100a one on Hopper).
ARCH_CLASSES = {"sm_90a": ("h100", "h200"), "sm_100a": ("b200",)}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
    except OSError:
        match = None
    return match[1].strip() if match else (platform.processor() or platform.machine())


def cpu_facts() -> dict[str, Any]:
    return {
        "model": cpu_model(),
        "architecture": platform.machine(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_bytes": psutil.virtual_memory().total,
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_facts(nvml: Any = None, cudart: Any = None) -> tuple[list[dict[str, Any]], str | None]:
    """``(gpus, reason)``: one dict per GPU, or no GPUs and the reason why none."""
    if nvml is None:
        import pynvml as nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        return [], f"no GPU: NVML unavailable ({error})"
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda_driver = nvml.nvmlSystemGetCudaDriverVersion()
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append({
                "index": index,
                "name": _text(nvml.nvmlDeviceGetName(handle)),
                "compute_capability": f"{major}.{minor}",
                "memory_bytes": nvml.nvmlDeviceGetMemoryInfo(handle).total,
                "max_sm_clock_mhz": nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
                "max_memory_clock_mhz": nvml.nvmlDeviceGetMaxClockInfo(
                    handle, nvml.NVML_CLOCK_MEM),
                "driver_version": driver,
                "cuda_driver_version": f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}",
                **_runtime_facts(index, cudart),
            })
    except nvml.NVMLError as error:
        return [], f"no GPU: NVML query failed ({error})"
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return gpus, None if gpus else "no GPU: NVML found no device"


def _runtime_facts(index: int, cudart: Any = None) -> dict[str, Any]:
    """SM count, L2 size and runtime version from the CUDA runtime (cuda-python)."""
    if cudart is None:
        from cuda.bindings import runtime as cudart
    try:
        err, version = cudart.cudaRuntimeGetVersion()
        err_props, props = cudart.cudaGetDeviceProperties(index)
    except RuntimeError as error:
        return {"cuda_runtime_error": str(error)}
    if int(err) or int(err_props):
        return {"cuda_runtime_error": f"{err}, {err_props}"}
    return {
        "sm_count": props.multiProcessorCount,
        "l2_cache_bytes": props.l2CacheSize,
        "cuda_runtime_version": f"{version // 1000}.{version % 1000 // 10}",
    }


def tpu_facts(jax: Any = None) -> tuple[list[dict[str, Any]], str | None]:
    """``(tpus, reason)``: one dict per TPU chip this process's jax runs on, or none and
    the reason why."""
    if jax is None:
        import jax
    try:
        devices = jax.devices()
    except RuntimeError as error:
        return [], f"no TPU: jax found no device ({error})"
    if not devices or devices[0].platform != "tpu":
        return [], f"no TPU: jax runs on {devices[0].platform if devices else 'nothing'}"
    backend = devices[0].client
    tpus = []
    for device in devices:
        stats = device.memory_stats() or {}
        tpus.append({"index": device.id, "name": device.device_kind,
                     "memory_bytes": stats.get("bytes_limit"),
                     "platform_version": str(backend.platform_version),
                     "jax_version": jax.__version__})
    return tpus, None


def device_class(gpus: list[dict[str, Any]], tpus: list[dict[str, Any]] = ()) -> str:
    """The class of GPU 0 (e.g. ``h200``), else of TPU 0 (``tpu-v5e``), else ``cpu``."""
    for found, classes, kind in ((gpus, GPU_CLASSES, "GPU"), (tpus, TPU_CLASSES, "TPU")):
        if found:
            name = found[0]["name"]
            for product, target in classes.items():
                if product in name:
                    return target
            raise CasebookError("configs/config.yaml", "target",
                                f"unknown {kind} {name!r}: set target to one of "
                                f"{', '.join(TARGETS)}")
    return "cpu"


def capture() -> dict[str, Any]:
    """The host record body: its TPUs asked only where it has no GPU (a GPU host's jax
    runs on the GPU)."""
    gpus, reason = gpu_facts()
    tpus, tpu_reason = ([], None) if gpus else tpu_facts()
    return {
        "hostname": platform.node(),
        "cpu": cpu_facts(),
        "gpus": gpus,
        "gpu_status": reason or f"{len(gpus)} GPU(s)",
        **({"tpus": tpus, "tpu_status": f"{len(tpus)} TPU chip(s)"} if tpus else
           {"tpu_status": tpu_reason} if tpu_reason else {}),
        "device_class": device_class(gpus, tpus),
    }


def run(target: str, out: str) -> dict[str, Any]:
    """The host stage: write the host record; refuse a GPU target this host does not have."""
    from casebook.core import records

    body = capture()
    if target != "cpu" and body["device_class"] != target:
        found = "; ".join(filter(None, (body["gpu_status"], body.get("tpu_status"))))
        raise CasebookError("configs/config.yaml", "target",
                            f"is {target!r} but this host is {body['device_class']!r} "
                            f"({found})")
    return records.write(out, "host", {"target": target, **body})


def measured_targets(settings: dict[str, Any]) -> list[str]:
    """The targets a run produces records for: config ``targets``, else ``target`` (auto:
    this machine's device class)."""
    if settings["targets"]:
        return list(settings["targets"])
    if settings["target"] != "auto":
        return [settings["target"]]
    return [device_class(gpu_facts()[0])]
