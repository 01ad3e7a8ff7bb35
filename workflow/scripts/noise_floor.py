"""Snakemake script of the noise floor stage: this host's A/A noise floor."""

from casebook.measure import pinning
from casebook.run import worker

target = snakemake.wildcards.target
# Pinned to one CPU before jax starts a backend, it may run in the run's worker.
worker.fork_from_server(snakemake, pins_itself=pinning.pins(target, snakemake.params.measurement))

from casebook.core.errors import reported

with reported(snakemake):
    pinning.pin_for(target, snakemake.params.measurement)
    from casebook.stages import timing  # after pinning: XLA sizes its pool when its backend starts

    timing.noise_floor(target, snakemake.params.measurement, snakemake.output[0])
