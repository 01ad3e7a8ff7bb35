"""Snakemake script: autotune one variant's tile choice at one point (accelerator targets)."""

from casebook.core.errors import reported
from casebook.run import worker

# Takes the machine (its threads): on a TPU target, run by the run's chip holder; else here.
worker.fork_from_server(snakemake)
with reported(snakemake):
    w = snakemake.wildcards
    from casebook.stages import autotune

    autotune.run(snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
                 snakemake.params.measurement, snakemake.output.record,
                 snakemake.output.samples, snakemake.input.floor)
