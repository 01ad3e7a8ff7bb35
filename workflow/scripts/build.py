"""Snakemake script: stage 3, build one variant of a case at every point."""

from casebook import build
from casebook.errors import reported

with reported(snakemake.log[0]):
    w = snakemake.wildcards
    build.run(snakemake.params.case_dir, w.case, w.variant, w.target, snakemake.output[0])
