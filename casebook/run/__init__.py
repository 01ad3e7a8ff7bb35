"""How a run's jobs run on this machine.

- ``worker``: a local cpu run's jobs forked from one process that imported jax and the
  cases once;
- ``chip_holder``: a TPU run's chip-holding jobs run in the one process that opened it;
- ``measured_job``: how a job that measures a kernel starts (worker, pinning, errors);
- ``off_device``: jobs that need no device kept off it;
- ``local_scheduler``: Snakemake's local scheduler as casebook runs it.

Each job's profile line is ``casebook.core.jobprofile``'s (written by ``errors.reported``).
"""
