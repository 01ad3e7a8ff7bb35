"""Snakemake script of the figures stage: the figures of one case on one target, with sidecars."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.report import figures

with reported(snakemake):
    figures.run(snakemake.config["case_dir"], snakemake.wildcards.case,
                snakemake.wildcards.shown_target, snakemake.params.measured)
