"""Snakemake's local scheduler makes one pass per finished job with the job-start cap
dropped, and about n^2/2 passes for n queued jobs with it; a local run starts one GPU job
at a time unless --resources says otherwise (casebook/run/local_scheduler.py)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import types

from casebook.run import local_scheduler

JOBS = 8
SNAKEFILE = f"""
rule all:
    input: expand("done{{i}}", i=range({JOBS}))

rule one:
    output: "done{{i}}"
    shell: "sleep 0.4; touch {{output}}"
"""
HOOK = """
from casebook.run import local_scheduler

onstart:
    assert local_scheduler.drop_rate_limit(workflow), "no cap was dropped"
"""


def _passes(tmp_path, snakefile: str) -> int:
    (tmp_path / "Snakefile").write_text(snakefile)
    done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--verbose"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return (done.stdout + done.stderr).count("Ready jobs")


def test_without_the_cap_the_scheduler_passes_once_per_job(tmp_path):
    hooked = _passes(tmp_path, HOOK + SNAKEFILE)
    assert hooked <= JOBS + 1, hooked


def test_with_the_cap_the_passes_grow_with_the_square_of_the_queue(tmp_path):
    """The control: on the pinned Snakemake the cap costs passes (if not, drop the hook)."""
    assert _passes(tmp_path, SNAKEFILE) >= 2 * JOBS


def test_a_remote_run_keeps_its_cap():
    limiter = object()
    workflow = types.SimpleNamespace(local_exec=False,
                                     scheduler=types.SimpleNamespace(job_rate_limiter=limiter))
    assert not local_scheduler.drop_rate_limit(workflow)
    assert workflow.scheduler.job_rate_limiter is limiter


GPU_SNAKEFILE = """
from casebook.run import local_scheduler

local_scheduler.one_gpu_job_at_a_time(workflow)

rule all:
    input: expand("span{i}", i=range(3))

rule on_device:
    output: "span{i}"
    resources: gpu=1
    shell: "date +%s.%N > {output}; sleep 1; date +%s.%N >> {output}"
"""


def _spans(tmp_path, *args: str) -> list[tuple[float, float]]:
    (tmp_path / "Snakefile").write_text(GPU_SNAKEFILE)
    done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "3", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    spans = [tuple(map(float, (tmp_path / f"span{i}").read_text().split())) for i in range(3)]
    return sorted(spans)


def _overlaps(spans) -> int:
    return sum(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def test_a_local_run_starts_one_gpu_job_at_a_time(tmp_path):
    assert _overlaps(_spans(tmp_path)) == 0


def test_resources_named_on_the_command_line_are_kept(tmp_path):
    """The control: --resources gpu=3 lets the three jobs share the device at once."""
    assert _overlaps(_spans(tmp_path, "--resources", "gpu=3")) == 2


def test_a_cluster_run_is_left_to_its_nodes():
    workflow = types.SimpleNamespace(local_exec=False, global_resources={})
    assert not local_scheduler.one_gpu_job_at_a_time(workflow)
    assert workflow.global_resources == {}

