"""casebook: GPU kernel case studies whose every figure carries its six conditions.

pinned environment -> host -> build -> verify -> noise floor -> time (and ablate) ->
baseline -> compare -> figures -> site.
Records go to results/<target>/..., figures to results/figures/, pages to site/public/
(the whole scheme: casebook/core/paths.py). `snakemake <case>` runs one case.
"""

from snakemake.utils import min_version

min_version("9.0")


configfile: os.path.join(workflow.basedir, "configs", "config.yaml")


# Validates the config (configs/schemas/config.schema.yaml) before anything uses it.
include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/host.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/noise.smk"
include: "workflow/rules/time.smk"
include: "workflow/rules/ablate.smk"
include: "workflow/rules/baseline.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/autotune.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/site.smk"


# The site, and every file a run keeps: one a killed job left deleted is made again.
rule all:
    default_target: True
    input:
        paths.SITE,
        SHARED_PARTS,
        [f for case in CASES for f in case_products(case)],


# Snakemake's default job-start cap makes a local scheduler re-plan n times a second after
# n jobs (casebook/run/local_scheduler.py): local runs drop it.
# A local cpu run serves its jobs from one process that has imported jax and the cases
# (casebook/run/worker.py), instead of each job importing them; a local run measuring a TPU
# runs its chip-holding jobs in one process that opened the chip (casebook/run/chip_holder.py),
# its own unless the TPU window started one for the step this run is part of.
onstart:
    local_scheduler.drop_rate_limit(workflow)
    if worker.serves(workflow, MEASURED):
        SERVERS.append((worker.stop, worker.start(Path(".snakemake"))))
    if chip_holder.serves(workflow, MEASURED):
        SERVERS.append((chip_holder.stop, chip_holder.start(Path(".snakemake"))))



# The site is rendered; a failed verification or a refused measurement then fails the run
# (config fail_on_failures), named in one line. Only the run itself, never one job of it.
onsuccess:
    worker.stop_all(SERVERS)
    if not workflow.remote_exec:
        verdict.finish(CASES, MEASURED, config["fail_on_failures"])


onerror:
    worker.stop_all(SERVERS)
