"""Snakemake script: stage 5, time one verified variant at one point."""

from casebook import timing
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    timing.time_kernel(
        snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
        snakemake.params.measurement, snakemake.input.verify,
        snakemake.output.record, snakemake.output.samples,
    )
