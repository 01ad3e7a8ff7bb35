"""Snakemake script: a target's tile table from its tile_choice records."""

from casebook import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook import tile_table
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    tile_table.generate(w.target, w.case, list(snakemake.input), snakemake.output[0])
