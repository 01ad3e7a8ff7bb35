"""Snakemake script: stage 6, check and time one baseline at one point."""

from casebook import timing
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    timing.time_baseline(
        snakemake.config["case_dir"], w.case, w.baseline, w.point, w.target,
        snakemake.params.measurement, snakemake.output.record, snakemake.output.samples,
    )
