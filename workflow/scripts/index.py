"""Snakemake script of the site stage: the index page, rendered as a part of the site."""

from casebook.run import worker

worker.fork_from_server(snakemake)  # jax and the cases imported once, in the run's worker

from casebook.core.errors import reported
from casebook.report import site

with reported(snakemake):
    p = snakemake.params
    site.index(
        snakemake.config["case_dir"],
        p.cases,
        {c: p.targets for c in p.cases},
        p.measured,
        p.site["title"],
        snakemake.output[0],
        dict(zip(p.cases, snakemake.input.statuses, strict=True)),
    )
