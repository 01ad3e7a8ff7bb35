"""Snakemake's local scheduler makes one pass per finished job with the job-start cap
dropped, and about n^2/2 passes for n queued jobs with it (casebook/local_scheduler.py)."""

from __future__ import annotations

import subprocess
import sys
import types

from casebook import local_scheduler

JOBS = 8
SNAKEFILE = f"""
rule all:
    input: expand("done{{i}}", i=range({JOBS}))

rule one:
    output: "done{{i}}"
    shell: "sleep 0.4; touch {{output}}"
"""
HOOK = """
from casebook import local_scheduler

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
