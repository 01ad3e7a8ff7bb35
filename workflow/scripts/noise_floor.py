"""Snakemake script: stage 5a, this host's A/A noise floor."""

from casebook import timing
from casebook.errors import reported

with reported(snakemake):
    timing.noise_floor(snakemake.wildcards.target, snakemake.params.measurement,
                       snakemake.output[0])
