"""Snakemake script: a target's tile table from its tile_choice records."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.stages import tile_table

with reported(snakemake):
    w = snakemake.wildcards
    tile_table.generate(w.target, w.case, list(snakemake.input), snakemake.output[0])
