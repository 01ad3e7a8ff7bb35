"""Snakemake script of the check-power stage: run one point's mutants through verify's own check."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.run import off_device

off_device.stay_on_host()  # the mutants are host numerics
with reported(snakemake):
    from casebook.stages import check_power  # after stay_on_host: jax reads JAX_PLATFORMS on import

    w = snakemake.wildcards
    check_power.run(snakemake.config["case_dir"], w.case, w.point, w.target, snakemake.output[0])
