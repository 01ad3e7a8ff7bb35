"""Snakemake script of the compare stage: a point's variants and baselines, interleaved."""

from casebook.core.errors import reported
from casebook.measure import pinning
from casebook.run import worker

# Takes the machine (its threads): on a TPU target, run by the run's chip holder; else here.
worker.fork_from_server(snakemake)
with reported(snakemake):
    w = snakemake.wildcards
    from casebook.stages import timing  # imports no jax: the process may still be pinned

    point = timing.point_to_compare(snakemake.config["case_dir"], w.case, w.point, w.target)
    pinning.pin_for(w.target, snakemake.params.measurement, point.stands_in)
    timing.compare_point(point, snakemake.params.measurement, snakemake.input.floor,
                         snakemake.output.record, snakemake.output.samples)
