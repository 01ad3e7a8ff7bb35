"""Snakemake script of the check-power stage: run one point's mutants through verify's own check."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported

with reported(snakemake):
    from casebook.stages import check_power

    w = snakemake.wildcards
    check_power.run(snakemake.config["case_dir"], w.case, w.point, w.target, snakemake.output[0])
