"""Snakemake script: stage 4b, run one point's mutants through verify's own check."""

from casebook import check_power
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    check_power.run(snakemake.config["case_dir"], w.case, w.point, w.target, snakemake.output[0])
