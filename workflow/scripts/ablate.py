"""Snakemake script of the ablate stage: lower and time one ablation at one point."""

from casebook import local_scheduler
from casebook.measured_job import measuring

w = snakemake.wildcards
with measuring(snakemake):
    from casebook import ablation  # after pinning: XLA sizes its pool when its backend starts

    ablation.run(
        snakemake.config["case_dir"], w.case, w.ablation, w.point, w.target,
        snakemake.params.measurement, snakemake.input.verify, snakemake.input.floor,
        snakemake.output.record, snakemake.output.samples,
        shared_host=local_scheduler.beside_others(snakemake.threads),
    )
