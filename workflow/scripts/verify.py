"""Snakemake script of the verify stage: verify one variant at one point against the oracle."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.stages import verify

with reported(snakemake):
    w = snakemake.wildcards
    verify.run(
        snakemake.config["case_dir"], w.case, w.variant, w.point, w.target, snakemake.output[0]
    )
