"""Snakemake script of the build stage: one variant's build record from its points' records."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.stages import build

with reported(snakemake):
    w = snakemake.wildcards
    build.gather(snakemake.config["case_dir"], w.case, w.variant, w.target,
                 list(snakemake.input), snakemake.output[0])
