"""Snakemake script of the build stage: build one variant of a case at one point."""

from casebook import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook import off_device
from casebook.errors import reported

off_device.stay_on_host()  # lowering for CUDA needs no device
with reported(snakemake):
    from casebook import build  # after stay_on_host: jax reads JAX_PLATFORMS on import

    w = snakemake.wildcards
    build.lower(snakemake.config["case_dir"], w.case, w.variant, w.point, w.target,
                snakemake.output[0])
