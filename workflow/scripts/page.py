"""Snakemake script: stage 8, one case's page."""

from casebook import site
from casebook.errors import reported

with reported(snakemake.log[0]):
    p = snakemake.params
    site.case_page(p.case_dir, snakemake.wildcards.case, p.targets, p.measured, p.title)
