"""Snakemake script of the bit-exact step: a port against the kernel it ports, bit for bit."""

from casebook import worker

worker.fork_from_server(snakemake)  # the device held by the run's worker, as verify's is

from casebook import bit_exact
from casebook.errors import reported

with reported(snakemake):
    w = snakemake.wildcards
    bit_exact.run(snakemake.config["case_dir"], w.case, w.target, snakemake.output[0])
