"""What a record depends on: the kernel files its case imports and its own config slice;
and a job never outlives the run that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from casebook.core import config, errors, jobprofile, paths, provenance

pytestmark = pytest.mark.host_rehearsal

CASES = ("grouped_gemm_fp8_bf16", "moe_nvfp4", "splash_attention")


def _shared(case: str) -> set[str]:
    return {p.name for p in provenance.kernel_sources(case) if p.parent == paths.KERNELS_DIR}


def test_a_case_depends_on_the_shared_modules_it_imports_and_no_other():
    assert _shared("grouped_gemm_fp8_bf16") == {"__init__.py", "contract.py", "cuda_toolkit.py",
                                                      "mutants.py", "runnable.py"}
    for case in ("moe_nvfp4", "splash_attention"):
        assert {"mgpu_interpret.py", "mgpu_lowering.py", "mutants.py"} <= _shared(case)
    assert "cuda_toolkit.py" in _shared("moe_nvfp4")  # cuobjdump of the compiled reference
    assert "cuda_toolkit.py" not in _shared("splash_attention")
    for case in CASES:
        own = {p for p in paths.kernel_dir(case).rglob("*.py") if "__pycache__" not in p.parts}
        found = set(provenance.kernel_sources(case))
        assert own <= found
        assert not any(p.is_relative_to(paths.kernel_dir(other))
                       for p in found for other in CASES if other != case)


def test_relative_and_package_imports_are_followed_and_readmes_are_not_sources(
        tmp_path, monkeypatch):
    kernels = tmp_path / "kernels"
    (kernels / "one").mkdir(parents=True)
    for name, text in {"__init__.py": "", "used.py": "from . import deep\n",
                       "deep.py": "", "unused.py": "",
                       "one/__init__.py": "from .. import used\nfrom .part import x\n",
                       "one/part.py": "x = 1\n", "one/README.md": "# one\n"}.items():
        (kernels / name).write_text(text)
    monkeypatch.setattr(paths, "SOURCE_ROOT", tmp_path)
    monkeypatch.setattr(paths, "KERNELS_DIR", kernels)
    provenance.kernel_sources.cache_clear()
    try:
        found = {p.relative_to(kernels).as_posix() for p in provenance.kernel_sources("one")}
    finally:
        provenance.kernel_sources.cache_clear()
    assert found == {"__init__.py", "used.py", "deep.py", "one/__init__.py", "one/part.py"}


def test_a_job_hash_changes_with_its_own_point_only():
    spec = config.load_case("configs/cases", "splash_attention")
    first, second = (p["name"] for p in spec["points"][:2])
    variant = spec["variants"][0]["name"]
    before = {p: provenance.job_sha256(spec, variant, p) for p in (first, second)}
    build = provenance.job_sha256(spec, variant)
    spec["points"][1]["params"]["seed_offset"] = 7
    assert provenance.job_sha256(spec, variant, first) == before[first]
    assert provenance.job_sha256(spec, variant, second) != before[second]
    assert provenance.job_sha256(spec, variant) != build  # a build reads every point
    spec["title"] = "another title"
    assert provenance.job_sha256(spec, variant, first) == before[first]


# A job: it starts its watch either before its run is killed or, still starting up
# (importing), only after.
CHILD = """
import os, sys, time
from casebook.core import errors
parent = os.getppid()
if sys.argv[1] == "started":
    errors.end_with_run()
print("ready", flush=True)
while os.getppid() == parent:
    time.sleep(0.05)
errors.end_with_run()
time.sleep(120)
"""
# A Snakemake run, as the workflow sets it up: its jobs inherit its pid.
RUN = """
import os, subprocess, sys, time
os.environ["CASEBOOK_RUN_PID"] = str(os.getpid())
child = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", ["started", "starting"])
def test_a_job_ends_when_its_run_is_killed(when):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(paths.SOURCE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.Popen([sys.executable, "-c", RUN, CHILD, when], env=env,
                           stdout=subprocess.PIPE, text=True)
    child = int(run.stdout.readline())
    assert run.stdout.readline().strip() == "ready"
    os.kill(child, 0)  # alive while its run is
    run.kill()
    run.wait()
    deadline = time.monotonic() + 30  # it polls every 0.05 s: a wide margin under load
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    pytest.fail(f"the job ({when}) outlived its run by 30 s")


@pytest.mark.parametrize("fails", [False, True])
def test_a_jobs_log_ends_with_its_profile(tmp_path, fails):
    job = types.SimpleNamespace(log=[str(tmp_path / "job.log")], rule="verify")
    with contextlib.suppress(SystemExit), errors.reported(job):
        sum(range(10**6))
        if fails:
            raise errors.CasebookError("x.json", "key", "bad")
    profile = jobprofile.read(tmp_path / "job.log")
    assert profile["rule"] == "verify"
    assert profile["startup_s"] > 0 and profile["work_s"] > 0
    assert profile["cpu_s"] > 0 and profile["max_rss_mib"] > 10
    assert ("casebook: error: x.json: key: bad" in (tmp_path / "job.log").read_text()) == fails
