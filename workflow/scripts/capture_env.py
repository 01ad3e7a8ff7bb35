"""Snakemake script of the env stage: this machine's environment record."""

from casebook import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook import envcapture
from casebook.errors import reported

with reported(snakemake):
    envcapture.run(snakemake.params.lock_platform, snakemake.wildcards.target, snakemake.output[0])
