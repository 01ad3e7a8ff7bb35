"""Snakemake script: stage 5a, this host's A/A noise floor."""

from casebook.errors import reported
from casebook.measure import pinning

with reported(snakemake):
    target = snakemake.wildcards.target
    pinning.pin_for(target, snakemake.params.measurement)
    from casebook import timing  # after pinning: XLA sizes its thread pool on import

    timing.noise_floor(target, snakemake.params.measurement, snakemake.output[0])
