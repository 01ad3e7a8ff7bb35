"""Snakemake script of the site stage: each target's shared records, as a part of the site."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.report import site

with reported(snakemake):
    site.target_records(snakemake.params.targets, snakemake.output[0])
