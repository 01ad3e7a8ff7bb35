"""Snakemake script of the build stage: build one variant of a case at one point."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.run import off_device

off_device.stay_on_host()  # lowering for CUDA needs no device
with reported(snakemake):
    from casebook.stages import build  # after stay_on_host: jax reads JAX_PLATFORMS on import

    w = snakemake.wildcards
    build.lower(snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
                snakemake.output[0])
