"""Snakemake script of the baseline stage: check and time one baseline at one point."""

from casebook.measure import pinning
from casebook.run import worker

w = snakemake.wildcards
# Pinned to one CPU before jax starts a backend, it may run in the run's worker.
worker.fork_from_server(snakemake, pins_itself=pinning.pins(w.target, snakemake.params.measurement))

from casebook.core.errors import reported

with reported(snakemake):
    pinning.pin_for(w.target, snakemake.params.measurement)
    from casebook.stages import timing  # after pinning: XLA sizes its pool when its backend starts

    timing.time_baseline(
        snakemake.config["case_dir"], w.case, w.baseline, w.point, w.target,
        snakemake.params.measurement, snakemake.input.floor, snakemake.output.record,
        snakemake.output.samples,
    )
