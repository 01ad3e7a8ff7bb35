"""Snakemake script: stage 5b, lower and time one ablation at one point."""

from casebook import local_scheduler, records, worker
from casebook.errors import CasebookError, reported
from casebook.measure import pinning

w = snakemake.wildcards
try:
    checked = records.read(snakemake.input.verify, "verify")
except CasebookError:  # read again below, where the error is reported
    checked = None
# As a time job: a one-core timing of a host stand-in may run in the run's worker.
stand_in = checked is not None and records.stands_in(checked)
worker.fork_from_server(
    snakemake, pins_itself=pinning.pins(w.target, snakemake.params.measurement, stand_in))

with reported(snakemake):
    if checked is None:  # unreadable above: read again to report why
        stand_in = records.stands_in(records.read(snakemake.input.verify, "verify"))
    pinning.pin_for(w.target, snakemake.params.measurement, stand_in)
    from casebook import ablation  # after pinning: XLA sizes its pool when its backend starts

    ablation.run(
        snakemake.config["case_dir"], w.case, w.ablation, w.point, w.target,
        snakemake.params.measurement, snakemake.input.verify, snakemake.input.floor,
        snakemake.output.record, snakemake.output.samples,
        shared_host=local_scheduler.beside_others(snakemake.threads),
    )
