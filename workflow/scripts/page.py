"""Snakemake script of the site stage: one case's page, rendered as a part of the site."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.report import site

with reported(snakemake):
    p = snakemake.params
    site.case_page(
        snakemake.config["case_dir"],
        snakemake.wildcards.case,
        p.targets,
        p.measured,
        p.site["title"],
        snakemake.output.part,
        snakemake.output.status,
    )
