"""Snakemake script: stage 5, time one verified variant at one point."""

from casebook import local_scheduler, records, worker
from casebook.errors import CasebookError, reported
from casebook.measure import pinning

w = snakemake.wildcards
try:
    interpreted = records.interpreted(records.read(snakemake.input.verify, "verify"))
except CasebookError:  # read again below, where the error is reported
    interpreted = False
if not pinning.pins(w.target, snakemake.params.measurement, interpreted):
    worker.fork_from_server(snakemake)  # jax imported once, in the run's worker

with reported(snakemake):
    checked = records.read(snakemake.input.verify, "verify")
    pinning.pin_for(w.target, snakemake.params.measurement, records.interpreted(checked))
    from casebook import timing  # after pinning: XLA sizes its thread pool on import

    timing.time_kernel(
        snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
        snakemake.params.measurement, snakemake.input.verify, snakemake.input.floor,
        snakemake.output.record, snakemake.output.samples,
        shared_host=local_scheduler.beside_others(snakemake.threads),
    )
