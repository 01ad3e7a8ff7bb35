"""Snakemake script of the build stage: lower one variant of a case at all its build-only points."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.run import off_device

off_device.stay_on_host()  # lowering for CUDA needs no device
with reported(snakemake):
    from casebook.stages import build  # after stay_on_host: jax reads JAX_PLATFORMS on import

    w = snakemake.wildcards
    build.lower_build_only(snakemake.config["case_dir"], w.case, w.variant, w.target,
                           snakemake.output[0])
