"""Snakemake script: autotune one variant's tile choice at one point (GPU targets)."""

from casebook import autotune
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    autotune.run(snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
                 snakemake.params.measurement, snakemake.output.record,
                 snakemake.output.samples)
