"""Snakemake script: stage 8, the style sheet and script, as a part of the site."""

from casebook import site
from casebook.errors import reported

with reported(snakemake):
    site.static_assets(snakemake.output[0])
