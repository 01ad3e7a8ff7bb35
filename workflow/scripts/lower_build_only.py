"""Snakemake script: stage 3, lower one variant of a case at all its build-only points."""

from casebook import build
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    build.lower_build_only(snakemake.config["case_dir"], w.case, w.variant, w.target,
                           snakemake.output[0])
