"""Snakemake's local scheduler as casebook runs it: no re-planning loop that grows with
every job, and one GPU job at a time.

Snakemake's command line caps job starts at 100 per second by default
(`--max-jobs-per-timespan 100/1s`). With that cap set, every scheduling pass that leaves
jobs waiting for cores arms a one-second timer that wakes the scheduler for another pass,
which arms another: each finished job adds one more such chain, so after n jobs the
scheduler makes about n passes a second, each walking every waiting job's inputs. On a
cold 2-core run of 370 jobs that was 1,904 CPU-seconds of Snakemake's own, a third of the
run (benchmarks/results/pipeline_time.json). Local jobs start only as cores free up, so the
cap limits nothing there; remote executors keep it (it spaces their submissions).

Every job that asks for a GPU (``resources: gpu``) uses device 0 (``casebook.measure.gpu``).
Locally Snakemake limits a resource only when the run names it (``--resources``), so an
H200 host once ran 36 such jobs at once: each process's XLA client took its share of the
device's memory, and the rest failed with "out of memory" or "no supported devices". A
local run without ``--resources gpu=N`` runs them one at a time. A TPU is held by one
process at a time: there, a job without the resource keeps its jax off the chip
(``off_device.off_the_chip``).
"""

from __future__ import annotations

import os

GPU = "gpu"  # the resource every job that runs on the device asks for

# The cores of the Snakemake run a job belongs to, in its environment: a job that got
# fewer (``threads``) ran beside other jobs. Not a param, which would rerun every job of a
# run with another --cores.
RUN_CORES = "CASEBOOK_RUN_CORES"


def publish_cores(cores: int) -> None:
    """Put the run's cores in the environment its jobs inherit (``RUN_CORES``)."""
    os.environ[RUN_CORES] = str(cores)


def beside_others(threads: int) -> bool:
    """Whether a job of ``threads`` threads had fewer cores than its run (``RUN_CORES``)."""
    return threads < int(os.environ.get(RUN_CORES, threads))


def drop_rate_limit(workflow) -> bool:
    """Remove the job-start cap from a local run's scheduler; True if one was removed.

    Call from `onstart:`, when the scheduler exists. A remote run, or a Snakemake whose
    scheduler has no such attribute, is left as it is.
    """
    scheduler = getattr(workflow, "scheduler", None)
    if not workflow.local_exec or getattr(scheduler, "job_rate_limiter", None) is None:
        return False
    scheduler.job_rate_limiter = None
    return True


def one_gpu_job_at_a_time(workflow) -> bool:
    """Limit a local run's ``gpu`` resource to 1 unless ``--resources`` set it; True if
    this set it. Call while the Snakefile is parsed, before the scheduler exists. A
    cluster's run is left as it is (each job gets its own node's GPUs)."""
    if not workflow.local_exec or workflow.global_resources.get(GPU).value is not None:
        return False
    workflow.global_resources[GPU] = 1
    return True
