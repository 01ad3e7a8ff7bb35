"""Case 03's bit-exact step on a CPU: the comparison with a fake device (numpy kernels, one
of which flips a bit), the record a host without an sm_90 GPU writes, and the page's
table of both."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from casebook.core import records
from casebook.report import page_tables
from casebook.stages import bit_exact as step
from kernels.contract import NotRunnable, Runnable
from kernels.grouped_gemm_fp8_bf16 import bitwise, device, numerics

POINTS = [
    {
        "name": "small",
        "params": {
            "m": [16, 40],
            "n": 256,
            "k": 128,
            "chunk": 64,
            "mode": "scale_only",
            "alpha": 1.0,
            "beta": 0.0,
        },
    },
    {
        "name": "flipped",
        "params": {
            "m": [32, 0, 8],
            "n": 128,
            "k": 64,
            "chunk": 64,
            "mode": "convert_only",
            "alpha": 0.5,
            "beta": 0.5,
        },
    },
]
FLIP = (9, 100)  # the element the fake reference changes at point "flipped"


def model(grouped, flip=None):
    def call(inputs):
        out = numerics.model(grouped, inputs)
        if flip is not None:
            out = out.copy()
            out.view(np.uint16)[flip] ^= 1  # the lowest mantissa bit
        return out

    return Runnable(
        prepare=lambda inputs: (inputs,),
        call=call,
        sync=lambda out: None,
        fetch=np.asarray,
        execution=None,
    )


def fake_gpu(found=("fake H200", 132)):
    def reference(grouped, build_dir):
        return model(grouped, FLIP if grouped.mode == "convert_only" else None)

    return SimpleNamespace(
        sm90_device=lambda: found,
        port_runnable=lambda grouped, sms, build_dir: model(grouped),
        reference_runnable=reference,
    )


def test_the_comparison_counts_differing_bits_per_configuration(tmp_path):
    got = bitwise.compare(POINTS, str(tmp_path), seed=7, gpu=fake_gpu())
    assert got == [
        {"point": "small", "elements": 56 * 256, "differing": 0, "first_differing": None},
        {"point": "flipped", "elements": 40 * 128, "differing": 1, "first_differing": list(FLIP)},
    ]


def test_outputs_of_another_shape_or_type_are_refused():
    f16 = np.zeros((2, 3), np.float16)
    with pytest.raises(ValueError, match="both must be f16 of one shape"):
        bitwise.differing(f16, np.zeros((3, 2), np.float16))
    with pytest.raises(ValueError, match="both must be f16"):
        bitwise.differing(f16, f16.astype(np.float32))


def test_without_an_sm90_gpu_it_says_so(tmp_path):
    with pytest.raises(NotRunnable, match="needs an sm_90 GPU"):
        bitwise.compare(POINTS, str(tmp_path), seed=7, gpu=fake_gpu(found=None))


@pytest.mark.skipif(
    device.sm90_device() is not None,
    reason="this host has an sm_90 GPU: the step runs (test_grouped_gemm_gpu.py)",
)
def test_a_cpu_host_records_that_it_could_not_run_it(tmp_path):
    out = tmp_path / "bit_exact.json"
    step.run("configs/cases", "grouped_gemm_fp8_bf16", "cpu", str(out))
    record = records.read(str(out), "bit_exact")
    assert not record["ran"] and "needs an sm_90 GPU" in record["not_run_reason"]
    assert (record["variant"], record["against"]) == ("cute_dsl", "cutlass_ex69")
    html = page_tables.bit_exact(record, lambda path: "r.json", str(out))
    assert "not run here: bit-exact comparison needs an sm_90 GPU" in html
    assert ' fail"' not in html


def test_the_page_marks_a_configuration_whose_bits_differ(tmp_path):
    compared = bitwise.compare(POINTS, str(tmp_path), seed=7, gpu=fake_gpu())
    out = tmp_path / "bit_exact.json"
    record = records.write(
        str(out),
        "bit_exact",
        {
            "target": "h200",
            "case": "grouped_gemm_fp8_bf16",
            "variant": "cute_dsl",
            "against": "cutlass_ex69",
            "seed": 7,
            "ran": True,
            "points": compared,
            "identical": False,
        },
    )
    html = page_tables.bit_exact(record, lambda path: "r.json", str(out))
    small, flipped = html.split("<tr>")[2:]
    assert "identical bits" in small and ' fail"' not in small
    assert "DIFFERENT BITS" in flipped and ' fail"' in flipped and "9 × 100" in flipped


def test_a_record_that_ran_states_whether_all_were_identical(tmp_path):
    with pytest.raises(Exception, match="identical"):
        records.write(
            str(tmp_path / "bit_exact.json"),
            "bit_exact",
            {
                "target": "h200",
                "case": "grouped_gemm_fp8_bf16",
                "variant": "cute_dsl",
                "against": "cutlass_ex69",
                "seed": 7,
                "ran": True,
                "points": [
                    {"point": "small", "elements": 4, "differing": 0, "first_differing": None}
                ],
            },
        )
