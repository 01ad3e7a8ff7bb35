"""Keep Snakemake's local scheduler from re-planning in a loop that grows with every job.

Snakemake's command line caps job starts at 100 per second by default
(`--max-jobs-per-timespan 100/1s`). With that cap set, every scheduling pass that leaves
jobs waiting for cores arms a one-second timer that wakes the scheduler for another pass,
which arms another: each finished job adds one more such chain, so after n jobs the
scheduler makes about n passes a second, each walking every waiting job's inputs. On a
cold 2-core run of 370 jobs that was 1,904 CPU-seconds of Snakemake's own, a third of the
run (benchmarks/results/pipeline_time.json). Local jobs start only as cores free up, so the
cap limits nothing there; remote executors keep it (it spaces their submissions).
"""

from __future__ import annotations

import os

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
