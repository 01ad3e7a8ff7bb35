"""Snakemake script of the bit-exact step: a port against the kernel it ports, bit for bit."""

from casebook.core.errors import reported

with reported(snakemake):
    from casebook.stages import bit_exact

    w = snakemake.wildcards
    bit_exact.run(snakemake.config["case_dir"], w.case, w.target, snakemake.output[0])
