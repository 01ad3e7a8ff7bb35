"""Snakemake script of the site stage: the rendered parts put in place of the site, whole."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.report import site

with reported(snakemake):
    site.publish_site(list(snakemake.input), snakemake.output[0])
