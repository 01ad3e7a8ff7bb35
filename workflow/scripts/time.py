"""Snakemake script: stage 5, time one verified variant at one point."""

from casebook import local_scheduler, records, worker
from casebook.errors import CasebookError, reported
from casebook.measure import pinning

w = snakemake.wildcards
try:
    checked = records.read(snakemake.input.verify, "verify")
except CasebookError:  # read again below, where the error is reported
    checked = None
# A one-core timing of a host stand-in (records.stand_in), or one pinned to a CPU before
# jax starts a backend, may run in the run's worker.
stand_in = checked is not None and records.stands_in(checked)
worker.fork_from_server(
    snakemake, pins_itself=pinning.pins(w.target, snakemake.params.measurement, stand_in))

with reported(snakemake):
    if checked is None:  # unreadable above: read again to report why
        stand_in = records.stands_in(records.read(snakemake.input.verify, "verify"))
    pinning.pin_for(w.target, snakemake.params.measurement, stand_in)
    from casebook import timing  # after pinning: XLA sizes its pool when its backend starts

    timing.time_kernel(
        snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
        snakemake.params.measurement, snakemake.input.verify, snakemake.input.floor,
        snakemake.output.record, snakemake.output.samples,
        shared_host=local_scheduler.beside_others(snakemake.threads),
    )
