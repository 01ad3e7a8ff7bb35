"""Snakemake script of the host stage: this machine's host record."""

from casebook import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook import hostcapture
from casebook.errors import reported

with reported(snakemake):
    hostcapture.run(snakemake.wildcards.target, snakemake.output[0])
