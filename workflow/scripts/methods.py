"""Snakemake script of the site stage: the methods page, rendered as a part of the site."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.report import site

with reported(snakemake):
    p = snakemake.params
    site.methods_page(
        snakemake.config["case_dir"],
        p.cases,
        p.targets,
        p.measured,
        p.site["title"],
        p.protocol,
        snakemake.output[0],
    )
