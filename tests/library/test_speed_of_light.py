"""The speed-of-light bound: each case's least work at a point, the target GPUs' peaks
(configs/peaks.yaml), and a measured median below the bound refused as impossible."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import kernels.grouped_gemm_fp8_bf16 as grouped
import kernels.moe_nvfp4 as moe
import kernels.splash_attention as splash
from casebook.core import config, records, speed_of_light
from casebook.core.errors import CasebookError
from casebook.report import conditions
from casebook.stages import timing
from kernels import contract
from kernels.contract import Runnable
from kernels.splash_attention import masks

WORK_S = 0.003


def test_the_peaks_table_has_every_target_gpu_with_its_source():
    peaks = speed_of_light.peaks()
    schema = yaml.safe_load(records.paths.RECORD_SCHEMA.read_text())
    assert set(peaks) == set(schema["$defs"]["target"]["enum"]) - {"cpu"}
    for entry in peaks.values():  # a vendor's published figures, named
        assert "datasheet" in entry["source"] or "documentation" in entry["source"]
    assert peaks["h100"]["tensor_flops"]["fp4"] is None  # Hopper: no FP4 tensor core
    # a TPU v5e's MXU: bf16 only; an fp8 bound uses its bf16 rate
    assert peaks["tpu-v5e"]["tensor_flops"] == {"fp4": None, "fp8": None, "bf16": 1.97e14}
    work = {"flops": 1.97e14, "bytes": 1, "math": "fp8", "basis": "b"}
    assert speed_of_light.bound(work, "tpu-v5e")["bound_s"] == pytest.approx(1.0)
    assert peaks["b200"]["tensor_flops"]["fp4"] == 2 * peaks["b200"]["tensor_flops"]["fp8"]


def test_the_bound_is_the_slower_of_compute_and_memory_on_the_fastest_usable_math():
    work = {"flops": 4 * 10**15, "bytes": 10**9, "math": "fp4", "basis": "b"}
    h100 = speed_of_light.bound(work, "h100")  # no fp4: fp8's rate
    assert h100["math"] == "fp8" and h100["limited_by"] == "compute"
    assert h100["bound_s"] == pytest.approx(4e15 / 1.979e15)
    b200 = speed_of_light.bound({**work, "flops": 10**9, "bytes": 8 * 10**12}, "b200")
    assert b200["limited_by"] == "memory" and b200["bound_s"] == pytest.approx(1.0)
    with pytest.raises(CasebookError, match="no peaks for 'a100'"):
        speed_of_light.bound(work, "a100")
    with pytest.raises(ValueError, match="math 'int4'"):
        speed_of_light.bound({**work, "math": "int4"}, "h100")


@pytest.mark.parametrize("mask", [{"kind": "causal"}, {"kind": "local", "window": [50, 7]},
                                  {"kind": "local", "window": [0, 300]}])
@pytest.mark.parametrize("segments", [None, 1, 3, 7])
def test_splash_counts_exactly_the_visible_pairs(mask, segments):
    params = {"seq_len": 384, "mask": mask, **({"segments": segments} if segments else {})}
    assert masks.visible_count(params) == int(masks.visible(params).sum())


def test_each_case_states_the_least_work_of_what_it_computes():
    attention = {"heads_q": 4, "heads_kv": 2, "seq_len": 256, "head_dim": 64,
                 "mask": {"kind": "causal"}, "dtype": "bfloat16"}
    forward = splash.work(attention, ("out",))
    backward = splash.work(attention, ("dq", "dk", "dv"))
    pairs = 4 * 256 * 257 // 2
    assert forward["flops"] == 2 * 2 * pairs * 64 and backward["flops"] == 3 * forward["flops"]
    assert forward["bytes"] == (2 * 4 + 2 * 2) * 256 * 64 * 2  # q, out; k, v
    path = {"experts": 2, "m": 128, "hidden": 256, "inter": 512, "expected_m": 100,
            "dtype": "nvfp4"}
    rows = 2 * 70
    whole = moe.work(path, ("a1", "a2", "out_fused"))
    assert whole["flops"] == 2 * rows * 1024 * 256 + 2 * rows * 256 * 512
    assert whole["math"] == "fp4"
    assert moe.work(path, ("a1",))["flops"] == 0
    assert moe.work(path, ("h",))["flops"] == 2 * rows * 1024 * 256
    gemm = {"m": [16, 48], "n": 256, "k": 512, "chunk": 128, "mode": "scale_only",
            "alpha": 1.0, "beta": 0.0, "dtype": "e5m2_bf16"}
    assert grouped.work(gemm, ("out",))["flops"] == 2 * 64 * 256 * 512


def _host_runnable(sleep_s: float) -> Runnable:
    def call(x):
        time.sleep(sleep_s)
        return x * 2

    return Runnable(prepare=lambda d: (d["x"],), call=call, sync=lambda out: None,
                    fetch=np.asarray, execution=contract.execution("host"))


def _measure(tmp_path, bound_s: float) -> tuple[dict, str]:
    bound = {**speed_of_light.bound({"flops": 1, "bytes": 1, "math": "bf16", "basis": "b"},
                                    "h200"), "bound_s": bound_s}
    samples = str(tmp_path / "s.csv")
    found = timing.measure(_host_runnable(WORK_S), lambda rng: {"x": rng.standard_normal(8)},
                           {"criterion": "fixed_count", "count": 8, "warmup_calls": 1,
                            "repeats": 1}, "hot", 1, samples, None, bound)
    return found, samples


def test_a_time_faster_than_physics_is_refused_and_an_honest_one_carries_its_fraction(
        tmp_path):
    fooled, samples = _measure(tmp_path, bound_s=1.0)  # 3 ms "beats" a 1 s bound
    assert not fooled["timed"]
    assert fooled["not_timed_reason"].startswith(f"{records.REFUSED}: impossible: median")
    assert "below the speed-of-light bound" in fooled["not_timed_reason"]
    assert len(Path(samples).read_text().splitlines()) > 1  # the samples are kept
    honest, _ = _measure(tmp_path, bound_s=WORK_S / 10)
    assert honest["timed"] and 0 < honest["speed_of_light"]["fraction"] <= 0.11


def test_a_cpu_page_states_each_points_bound_on_every_gpu_never_measured():
    spec = config.load_case("configs/cases", "grouped_gemm_fp8_bf16")
    ev = SimpleNamespace(case=spec["name"], target="cpu", spec=spec,
                         variants=[v["name"] for v in spec["variants"]],
                         points=[p["name"] for p in spec["points"]], noise_floor=None)
    peaks_line, *lines = conditions.light_lines(ev)
    assert "own matmul and copy peaks: not measured" in peaks_line
    assert len(lines) == len(spec["points"])
    assert all("not measured on GPU: H100" in line and "B200" in line for line in lines)
    assert speed_of_light.for_target(grouped, spec["points"][0]["params"], ("out",),
                                     "cpu") is None


def test_the_methods_page_states_the_rule_and_every_peak_with_its_source():
    from casebook.report import methods

    rule = methods.measurement_rules()["speed_of_light"]
    assert "max(FLOPs / tensor peak, bytes / bandwidth)" in rule
    for gpu in ("h100", "h200", "b200"):
        assert f"{gpu}: NVIDIA" in rule
    assert rule.count("datasheet") == 3


MEASURED = {"matmul_flops": 1.2e15, "matmul_math": "bf16", "copy_bytes_per_s": 1e12,
            "clock_kind": "cupti_kernel", "basis": "a test's"}


def test_a_measured_peak_above_the_datasheet_raises_the_bound_and_one_below_does_not():
    """A bound never refuses what the host was measured doing: an H200 measured at a
    bf16 rate above its datasheet's bounds bf16 work by the measured rate; its copy,
    below the datasheet's bandwidth, leaves the bandwidth alone."""
    entry = speed_of_light.peaks()["h200"]
    raised = speed_of_light.with_measured(entry, MEASURED)
    assert raised["tensor_flops"]["bf16"] == 1.2e15 > entry["tensor_flops"]["bf16"]
    assert raised["tensor_flops"]["fp8"] == entry["tensor_flops"]["fp8"]
    assert raised["memory_bytes_per_s"] == entry["memory_bytes_per_s"]
    assert raised["source"].endswith("Raised to this host's measured bf16 tensor rate.")
    assert speed_of_light.with_measured(entry, None) is entry
    work = {"flops": 2 * 4096**3, "bytes": 1, "math": "bf16", "basis": "test"}
    plugin = SimpleNamespace(work=lambda params, outputs: work)
    datasheet = speed_of_light.for_target(plugin, {}, ("out",), "h200")
    measured = speed_of_light.for_target(plugin, {}, ("out",), "h200", MEASURED)
    assert measured["bound_s"] == pytest.approx(work["flops"] / 1.2e15)
    assert measured["bound_s"] < datasheet["bound_s"]


def test_this_hosts_own_peaks_are_measured_and_shown_beside_the_bound():
    from casebook.measure import engine, peaks

    settings = timing.default_settings(criterion="fixed_count", count=5, repeats=1)
    found = peaks.measure(settings, 1, engine.Devices(None, "no GPU: test"))
    assert found["matmul_math"] == "f32" and found["clock_kind"] == "host"
    assert 1e8 < found["matmul_flops"] < 1e14 and 1e8 < found["copy_bytes_per_s"] < 1e13
    spec = config.load_case("configs/cases", "splash_attention")
    ev = SimpleNamespace(case=spec["name"], target="cpu", spec=spec,
                         variants=[v["name"] for v in spec["variants"]],
                         points=[p["name"] for p in spec["points"]],
                         noise_floor={"peaks": found})
    line = conditions.light_lines(ev)[0]
    assert line.startswith("This host's own peaks, measured with its noise floor: f32")
    assert "no GPU's bound applies" in line


def test_peaks_measured_in_a_precision_the_datasheet_lacks_leave_its_rates():
    """A GPU target's noise floor measured on a host without a GPU (float32): the bound
    keeps the datasheet's tensor rates, and the condition says why."""
    cpu_made = {**MEASURED, "matmul_math": "f32", "matmul_flops": 2e11,
                "copy_bytes_per_s": 8e9}
    entry = speed_of_light.peaks()["h200"]
    assert speed_of_light.with_measured(entry, cpu_made)["tensor_flops"] == \
        entry["tensor_flops"]
    text = conditions._measured_peaks_text(cpu_made, entry)
    assert "the datasheet's tensor rates (it states none for f32)" in text
