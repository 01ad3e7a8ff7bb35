"""Snakemake script of the site stage: the style sheet and script, as a part of the site."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.report import site

with reported(snakemake):
    site.static_assets(snakemake.output[0])
