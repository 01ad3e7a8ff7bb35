"""Snakemake script of the site stage: the rendered parts put in place of the site, whole."""

from casebook import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook import site
from casebook.errors import reported

with reported(snakemake):
    site.publish_site(list(snakemake.input), snakemake.output[0])
