"""Snakemake script of the env stage: this machine's environment record."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.stages import envcapture

with reported(snakemake):
    envcapture.run(snakemake.params.lock_platform, snakemake.wildcards.target, snakemake.output[0])
