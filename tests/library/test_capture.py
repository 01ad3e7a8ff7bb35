"""Environment and host capture, with the GPU path exercised through fakes."""

from __future__ import annotations

import platform
from types import SimpleNamespace

import pytest

from casebook.core import locks, paths, records
from casebook.core.errors import CasebookError
from casebook.stages import envcapture, hostcapture

pytestmark = pytest.mark.host_rehearsal


def test_cpu_lock_pins_jax_0_10_2_with_hashes():
    pins = locks.versions(paths.lock_file("cpu"))
    assert pins["jax"] == "0.10.2"
    assert {"snakemake", "jaxlib", "numpy", "matplotlib", "jinja2"} <= pins.keys()
    text = paths.lock_file("cpu").read_text()
    assert text.count("--hash=sha256:") >= len(pins)


def test_cuda_lock_pins_the_gpu_stack():
    pins = locks.versions(paths.lock_file("cuda"))
    assert {"jax-cuda13-plugin", "cupti-python", "nvidia-ml-py", "cuda-python"} <= pins.keys()


def test_bad_lock_line_is_named(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text("numpy==2.0 \\\n    --hash=sha256:00\nnot a pin\n")
    with pytest.raises(CasebookError, match="line 3"):
        locks.versions(lock)


def test_drift_names_missing_and_changed_packages():
    locked = {"a": "1", "b": "2", "c": "3"}
    found = {"a": "1", "b": "2.1", "d": "4"}
    assert envcapture.drift(locked, found) == [
        {"package": "b", "locked": "2", "found": "2.1"},
        {"package": "c", "locked": "3", "found": None},
    ]


def test_capture_describes_this_interpreter():
    body = envcapture.capture("cpu")
    assert body["python"]["version"] == platform.python_version()
    assert body["lock"]["file"] == "env/cpu.lock"
    assert body["reference_lock"]["file"] == "env/reference.lock"
    assert "flashinfer-python" not in body["unlocked"]  # locked, by the reference lock
    assert body["matches_lock"] == (body["drift"] == [])
    assert body["packages"]["jax"]


def test_capture_records_the_runtime_variables_set(monkeypatch):
    monkeypatch.setenv("PJRT_NPROC", "7")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    variables = envcapture.capture("cpu")["runtime_variables"]
    assert variables["PJRT_NPROC"] == "7"
    assert "XLA_FLAGS" not in variables


class FakeNVMLError(Exception):
    pass


def fake_nvml(devices, fail_init=False):
    def init():
        if fail_init:
            raise FakeNVMLError("Driver Not Loaded")

    return SimpleNamespace(
        NVMLError=FakeNVMLError, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"580.159.03",
        nvmlSystemGetCudaDriverVersion=lambda: 13000,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: devices[i],
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetName=lambda h: h,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=141 * 2**30),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: {1: 1980, 2: 3201}[kind],
    )


fake_cudart = SimpleNamespace(
    cudaRuntimeGetVersion=lambda: (0, 13000),
    cudaGetDeviceProperties=lambda i: (0, SimpleNamespace(multiProcessorCount=132,
                                                          l2CacheSize=60 * 2**20)),
)


def test_no_gpu_is_a_clean_fact():
    gpus, reason = hostcapture.gpu_facts(fake_nvml([], fail_init=True), fake_cudart)
    assert gpus == [] and reason.startswith("no GPU")
    assert hostcapture.device_class(gpus) == "cpu"


def test_gpu_facts_through_nvml_and_the_runtime():
    gpus, reason = hostcapture.gpu_facts(fake_nvml(["NVIDIA H200"]), fake_cudart)
    assert reason is None
    (gpu,) = gpus
    assert gpu["compute_capability"] == "9.0" and gpu["sm_count"] == 132
    assert gpu["cuda_driver_version"] == "13.0" and gpu["driver_version"] == "580.159.03"
    assert hostcapture.device_class(gpus) == "h200"


def test_runtime_errors_are_recorded_not_raised():
    failing = SimpleNamespace(cudaRuntimeGetVersion=lambda: (35, None),
                              cudaGetDeviceProperties=lambda i: (35, None))
    gpus, _ = hostcapture.gpu_facts(fake_nvml(["NVIDIA H100 80GB HBM3"]), failing)
    assert "cuda_runtime_error" in gpus[0]
    assert hostcapture.device_class(gpus) == "h100"


def test_unknown_gpu_asks_for_a_target():
    with pytest.raises(CasebookError, match="target"):
        hostcapture.device_class([{"name": "Some GPU"}])


def fake_jax(platform: str, kinds: list[str]) -> SimpleNamespace:
    """jax as a host with ``kinds`` devices on ``platform`` shows it."""
    client = SimpleNamespace(platform_version="PJRT C API\nTFRT TPU v5 lite\nlibtpu 0.0.42")
    devices = [SimpleNamespace(id=i, platform=platform, device_kind=kind, client=client,
                               memory_stats=lambda: {"bytes_limit": 16909336064})
               for i, kind in enumerate(kinds)]
    return SimpleNamespace(devices=lambda: devices, __version__="0.10.2")


def test_a_tpu_is_read_from_jax_and_classed_by_its_device_kind():
    tpus, reason = hostcapture.tpu_facts(fake_jax("tpu", ["TPU v5 lite"]))
    assert reason is None
    assert tpus == [{"index": 0, "name": "TPU v5 lite", "memory_bytes": 16909336064,
                     "platform_version": "PJRT C API\nTFRT TPU v5 lite\nlibtpu 0.0.42",
                     "jax_version": "0.10.2"}]
    assert hostcapture.device_class([], tpus) == "tpu-v5e"
    # a GPU comes first, where a host has both
    assert hostcapture.device_class([{"name": "NVIDIA H200"}], tpus) == "h200"
    with pytest.raises(CasebookError, match=r"unknown TPU 'TPU v4'.*tpu-v5e"):
        hostcapture.device_class([], [{"name": "TPU v4"}])


def test_jax_on_a_cpu_is_no_tpu():
    tpus, reason = hostcapture.tpu_facts(fake_jax("cpu", ["cpu"]))
    assert tpus == [] and reason == "no TPU: jax runs on cpu"
    assert hostcapture.tpu_facts() == ([], "no TPU: jax runs on cpu")  # this host


def test_this_host_capture_never_crashes():
    body = hostcapture.capture()
    assert body["cpu"]["logical_cores"] >= 1 and body["cpu"]["memory_bytes"] > 0
    assert body["device_class"] in hostcapture.TARGETS
    records.check("host.json", "host", records.stamp("host", {"target": body["device_class"],
                                                              **body}))


def test_a_gpu_target_on_a_host_without_it_is_refused(tmp_path):
    if hostcapture.capture()["device_class"] == "h200":
        pytest.skip("this host is an H200: the refusal needs a host without one")
    with pytest.raises(CasebookError, match="target"):
        hostcapture.run("h200", str(tmp_path / "host.json"))
    assert not (tmp_path / "host.json").exists()


def test_cpu_model_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU @ 3GHz\n")
    assert hostcapture.cpu_model(info) == "Test CPU @ 3GHz"


def test_drift_says_why_the_offline_host_was_not_given_a_package():
    locked = {"a": "1", "b": "2", "ruff": "0.1"}
    found = {"a": "1.1"}
    assert envcapture.drift(locked, found, {"ruff": "lint, run where the code is edited"}) == [
        {"package": "a", "locked": "1", "found": "1.1"},
        {"package": "b", "locked": "2", "found": None},
        {"package": "ruff", "locked": "0.1", "found": None,
         "not_carried": "lint, run where the code is edited"},
    ]


def test_the_software_condition_shows_other_versions_before_what_was_left_out():
    from casebook.report import conditions
    from casebook.report.evidence import Evidence

    missing = [{"package": f"tool{i}", "locked": "1", "found": None} for i in range(6)]
    env = {"python": {"version": "3.12.3"}, "os": {"platform": "Linux"},
           "packages": {"jax": "0.11.2"}, "matches_lock": False, "tools": {},
           "lock": {"file": "env/cuda.lock", "sha256": "0" * 64},
           "drift": [*missing, {"package": "ruff", "locked": "0.1", "found": None,
                                "not_carried": "lint"},
                     {"package": "numpy", "locked": "2.5.5", "found": "2.4.0"}]}
    host = {"gpus": [], "gpu_status": "no GPU",
            "cpu": {"model": "CPU", "usable_cores": 2, "logical_cores": 2,
                    "memory_bytes": 2**30}}
    ev = Evidence(case="c", target="h200", spec={"reference": {"package": "jax"}}, env=env,
                  host=host, builds={}, verify={}, time={}, baselines={}, sources=[],
                  kernel_sources_sha256="s", noise_floor=None)
    (line,) = [x for x in conditions.hardware_software(ev) if x.startswith("Environment")]
    assert "DRIFT from the lock in 8 package(s): numpy 2.4.0 (locked 2.5.5), tool0 missing" in line
    assert "1 not given to this offline host on purpose (ruff)" in line
