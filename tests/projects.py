"""Tiny projects for end-to-end tests: a copy of the sources and a one-point config."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from casebook import paths

SOURCES = ["Snakefile", "workflow", "kernels", "configs", "site", "env", "benchmarks"]
# A loose target and few A/A rounds keep the run short; the protocol is the real one.
MEASUREMENT = {"warmup_calls": 1, "criterion": "median_precision", "target": 0.05,
               "min_samples": 5, "min_time_s": 0.001, "timeout_s": 5, "confidence": 0.9,
               "noise_floor": {"size": 64, "rounds": 4, "quantile": 0.75}}


def tiny_case(tolerance_scale: float = 1.0) -> dict:
    """The real case, cut to one point, one build-only point, the port and upstream; the
    point cut to one head (the interpreter's cost grows with the programs; the sequence
    length stays, and with it the output's scale against the f16 tolerance, which a 1%
    bias must stay under). The shipped points are checked whole by the kernel tests."""
    case = yaml.safe_load((paths.SOURCE_ROOT / "configs/cases/splash_attention.yaml").read_text())
    case["points"] = case["points"][:1]
    case["points"][0]["params"].update(heads_q=1, heads_kv=1)
    case["build_only_points"] = case["build_only_points"][:1]
    case["variants"] = [v for v in case["variants"] if v["name"] in ("mgpu", "upstream")]
    case["autotune"]["variants"] = ["mgpu"]
    case["verify"]["trials"] = 1
    for tol in case["tolerances"].values():
        for one in ([tol] if "atol" in tol else tol.values()):  # one, or one per output
            one["atol"] *= tolerance_scale
            one["rtol"] *= tolerance_scale
    return case


def tiny_moe_case() -> dict:
    """Case 01 cut to its first point, its smallest build-only point, the whole fused
    path and one GEMM variant, with both baselines."""
    case = yaml.safe_load((paths.SOURCE_ROOT / "configs/cases/moe_nvfp4.yaml").read_text())
    case["points"] = case["points"][:1]
    case["build_only_points"] = case["build_only_points"][-1:]
    case["variants"] = [v for v in case["variants"]
                        if v["name"] in ("moe_fused", "gemm1_m128n128s3")]
    case["verify"]["trials"] = 1
    return case


def make_project(root: Path, *cases: dict) -> Path:
    """A copy of the sources plus a tiny config running ``cases``; the project folder."""
    project = root / "project"
    project.mkdir()
    for name in SOURCES:
        src = paths.SOURCE_ROOT / name
        copy = shutil.copytree if src.is_dir() else shutil.copy
        copy(src, project / name, **({"ignore": shutil.ignore_patterns("public", "__pycache__")}
                                     if src.is_dir() else {}))
    case_dir = root / "cases"
    case_dir.mkdir()
    for case in cases:
        (case_dir / f"{case['name']}.yaml").write_text(yaml.safe_dump(case))
    (root / "tiny.yaml").write_text(yaml.safe_dump({
        "cases": [case["name"] for case in cases], "case_dir": str(case_dir), "target": "cpu",
        "measurement": MEASUREMENT}))
    return project


def snakemake(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile",
         str(project.parent / "tiny.yaml"), *args],
        cwd=project, capture_output=True, text=True, timeout=800)
