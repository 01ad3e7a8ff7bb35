"""Snakemake script: stage 8, the methods page."""

from casebook import site
from casebook.errors import reported

with reported(snakemake.log[0]):
    p = snakemake.params
    site.methods_page(p.case_dir, p.cases, p.targets, p.measured, p.title, p.protocol)
