"""How a job that measures a kernel (time, ablate) starts: in the run's worker where it
may run there, pinned to a CPU where its target asks, its errors reported as one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from casebook.core import records, stand_ins
from casebook.core.errors import CasebookError, reported
from casebook.measure import pinning
from casebook.run import worker


@contextlib.contextmanager
def measuring(job: Any) -> Iterator[None]:
    """Run the body as measuring job ``job`` (a script's ``snakemake``, whose input
    ``verify`` is the verify record of the kernel it measures). A one-core timing of a
    host stand-in (``stand_ins.is_stand_in``), or one pinned to a CPU before jax starts a
    backend, may run in the run's worker; import jax-using modules inside the body."""
    target, measurement = job.wildcards.target, job.params.measurement
    try:
        checked = records.read(job.input.verify, "verify")
    except CasebookError:  # read again below, where the error is reported
        checked = None
    stand_in = checked is not None and stand_ins.verified_by_stand_in(checked)
    worker.fork_from_server(job, pins_itself=pinning.pins(target, measurement, stand_in))
    with reported(job):
        if checked is None:  # unreadable above: read again to report why
            stand_in = stand_ins.verified_by_stand_in(records.read(job.input.verify, "verify"))
        # before the body: XLA sizes its pool when its backend starts
        pinning.pin_for(target, measurement, stand_in)
        yield
