"""Snakemake script of the bit-exact step: a port against the kernel it ports, bit for bit."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # the device held by the run's worker, as verify's is

from casebook.core.errors import reported
from casebook.stages import bit_exact

with reported(snakemake):
    w = snakemake.wildcards
    bit_exact.run(snakemake.config["case_dir"], w.case, w.target, snakemake.output[0])
