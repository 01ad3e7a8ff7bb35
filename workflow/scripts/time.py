"""Snakemake script: stage 5, time one verified variant at one point."""

from casebook import local_scheduler, records
from casebook.errors import reported
from casebook.measure import pinning

with reported(snakemake):
    w = snakemake.wildcards
    checked = records.read(snakemake.input.verify, "verify")
    pinning.pin_for(w.target, snakemake.params.measurement, records.interpreted(checked))
    from casebook import timing  # after pinning: XLA sizes its thread pool on import

    timing.time_kernel(
        snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
        snakemake.params.measurement, snakemake.input.verify, snakemake.input.floor,
        snakemake.output.record, snakemake.output.samples,
        shared_host=local_scheduler.beside_others(snakemake.threads),
    )
