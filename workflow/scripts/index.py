"""Snakemake script: stage 8, the index page and static assets."""

from casebook import site
from casebook.errors import reported

with reported(snakemake.log[0]):
    p = snakemake.params
    site.index(p.case_dir, p.cases, {c: p.targets for c in p.cases}, p.measured, p.title)
