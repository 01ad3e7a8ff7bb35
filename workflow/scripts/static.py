"""Snakemake script of the site stage: the style sheet and script, as a part of the site."""

from casebook import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook import site
from casebook.errors import reported

with reported(snakemake):
    site.static_assets(snakemake.output[0])
