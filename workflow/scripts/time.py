"""Snakemake script of the time stage: time one verified variant at one point."""

from casebook.run import local_scheduler
from casebook.run.measured_job import measuring

w = snakemake.wildcards
with measuring(snakemake):
    from casebook.stages import timing  # after pinning: XLA sizes its pool when its backend starts

    timing.time_kernel(
        snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
        snakemake.params.measurement, snakemake.input.verify, snakemake.input.floor,
        snakemake.output.record, snakemake.output.samples,
        shared_host=local_scheduler.beside_others(snakemake.threads),
    )
