"""Snakemake script: stage 7, the figures of one case on one target, with sidecars."""

from casebook import figures
from casebook.errors import reported

with reported(snakemake):
    figures.run(snakemake.config["case_dir"], snakemake.wildcards.case,
                snakemake.wildcards.shown_target, snakemake.params.measured)
