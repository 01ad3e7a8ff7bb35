"""Snakemake script: stage 3, build one variant of a case at one point."""

from casebook import build
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    build.lower(snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
                snakemake.output[0])
