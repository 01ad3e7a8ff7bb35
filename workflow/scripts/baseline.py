"""Snakemake script: stage 6, check and time one baseline at one point."""

from casebook.errors import reported
from casebook.measure import pinning

with reported(snakemake):
    w = snakemake.wildcards
    pinning.pin_for(w.target, snakemake.params.measurement)
    from casebook import timing  # after pinning: XLA sizes its thread pool on import

    timing.time_baseline(
        snakemake.config["case_dir"], w.case, w.baseline, w.point, w.target,
        snakemake.params.measurement, snakemake.input.floor, snakemake.output.record,
        snakemake.output.samples,
    )
