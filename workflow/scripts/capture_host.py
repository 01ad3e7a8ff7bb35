"""Snakemake script of the host stage: this machine's host record."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.stages import hostcapture

with reported(snakemake):
    hostcapture.run(snakemake.wildcards.target, snakemake.output[0])
